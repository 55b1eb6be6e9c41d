"""`oncely web`: the browser dashboard, an ASGI app to mount or to serve standalone.

    from oncely.web import dashboard
    api.mount("/oncely", dashboard(app, permissions=resolver, redact=hide_secrets))

Every page reads through the app's public API and the store's bounded reads; every action
calls one public `Oncely` method with the actor the resolver names (which writes the audit
row). Read-only unless the resolver allows actions; see docs/dashboard.md.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from importlib import resources

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..app import Oncely
from ..errors import (
    BadInputError,
    DatabaseUnavailableError,
    OncelyError,
    SchemaMissingError,
    SchemaTooNewError,
)
from . import actions, pages, schedules
from .access import (
    ACTIONS,
    SESSION_COOKIE,
    Access,
    Grant,
    Permission,
    Resolver,
    Sessions,
    client_of,
    new_secret,
    read_only,
    same,
    token_resolver,
)
from .render import Redactor, Settings, base, error, forged, page, redirect, throttled

__all__ = ["ACTIONS", "Grant", "Permission", "Resolver", "dashboard"]

Endpoint = Callable[[Settings, Request], Awaitable[Response]]


def dashboard(
    app: Oncely,
    *,
    permissions: Resolver | None = None,
    redact: Redactor | None = None,
    token: str | None = None,
    title: str = "oncely",
) -> Starlette:
    """The dashboard of `app` as a Starlette (ASGI) app, to mount anywhere.

    `permissions(request)` returns "read", "all", a set of action names (`ACTIONS`), a
    `Grant` (the same and the actor for the audit rows) or None (403 on every page); sync
    or async. Default: read-only. With `token` (and no resolver), a request that presents
    it (`Authorization: Bearer …`, or the cookie of `POST /login`) may do everything.
    `redact(task_name, args)` returns what the pages show of a task's arguments.
    """
    key = new_secret().encode()
    sessions = Sessions()
    if permissions is None:
        permissions = (
            token_resolver(token, allow_actions=True, sessions=sessions) if token else read_only
        )
    settings = Settings(
        app=app, resolver=permissions, redact=redact, key=key, token=token, sessions=sessions
    )
    static = resources.files("oncely.web") / "static"

    def bind(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        return functools.partial(endpoint, settings)

    def post(path: str, name: str | None, handler: actions.Handler) -> Route:
        return Route(path, bind(actions.action(name, handler)), methods=["POST"])

    routes = [
        Route("/", bind(pages.overview)),
        Route("/healthz", healthz),
        Route("/login", bind(login_form)),
        Route("/login", bind(login), methods=["POST"]),
        Route("/logout", bind(logout), methods=["POST"]),
        Route("/jobs/schedule:{name}", bind(schedules.ledger_page)),
        Route("/jobs/{job}", bind(pages.job_page)),
        post("/jobs/{job}/pause", "pause", actions.pause),
        post("/jobs/{job}/resume", "resume", actions.resume),
        post("/jobs/{job}/run", "run", actions.run),
        post("/jobs/{job}/backfill", "backfill", actions.backfill),
        post("/jobs/{job}/release", "release", actions.release),
        post("/jobs/{job}/skip", "skip", actions.skip),
        post("/jobs/{job}/cancel", "cancel", actions.cancel),
        Route("/tasks", bind(pages.tasks_page)),
        post("/tasks/bulk", None, actions.bulk),
        Route("/tasks/{task_id}", bind(pages.task_page)),
        post("/tasks/{task_id}/retry", "task_retry", actions.task_action("retry")),
        post("/tasks/{task_id}/discard", "task_discard", actions.task_action("discard")),
        post("/tasks/{task_id}/cancel", "task_cancel", actions.task_action("cancel")),
        Route("/schedules", bind(schedules.schedules_page)),
        post("/schedules", "schedule_add", schedules.add),
        Route("/schedules/{name}", bind(schedules.schedule_page)),
        *(
            post(f"/schedules/{{name}}/{verb}", f"schedule_{verb}", handler)
            for verb, handler in schedules.HANDLERS.items()
        ),
        Route("/audit", bind(pages.audit_page)),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers={
            OncelyError: functools.partial(failed, settings),
            Exception: functools.partial(broken, settings),
        },
    )


HEADERS = [
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        b"frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
"""What every answer of the dashboard carries: no framing by any page (clickjacking), no
script at all, no type sniffing, no URL of the dashboard in another site's Referer."""


class SecurityHeaders:
    """Adds HEADERS to every response of the dashboard (pages, errors, static files)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def failed(settings: Settings, request: Request, exc: Exception) -> Response:
    """An OncelyError no page handled: the error page; 503 while the database is away."""
    if isinstance(exc, DatabaseUnavailableError | SchemaMissingError | SchemaTooNewError):
        status = 503
    elif isinstance(exc, BadInputError):
        status = 400
    else:
        status = 500
    return error(settings, request, status, f"{exc} (nothing changed; reload to try again)")


async def broken(settings: Settings, request: Request, exc: Exception) -> Response:
    """Any other error: the error page, never a bare 500 (the server logs the traceback)."""
    return error(
        settings, request, 500, f"the dashboard failed: {type(exc).__name__} (nothing changed)"
    )


async def healthz(_request: Request) -> Response:
    return PlainTextResponse("ok")


async def login_form(settings: Settings, request: Request) -> Response:
    granted = await pages.guard(settings, request)
    if not isinstance(granted, Access):
        return granted
    return page(settings, request, "login.html", granted, configured=settings.token is not None)


async def login(settings: Settings, request: Request) -> Response:
    """Exchange the token for a new server-side session (an HttpOnly, SameSite=Strict
    cookie); wrong tokens from one client are throttled."""
    client = client_of(request)
    too_many = throttled(settings, request, client, "not logged in")
    if too_many is not None:
        return too_many
    form = await request.form()
    try:
        refused = forged(settings, request, form)
        if refused is not None:
            return error(settings, request, 403, f"{refused}: not logged in")
        given = form.get("token")
        if settings.token is None:
            return error(settings, request, 403, "this dashboard has no token: it is read-only")
        if not isinstance(given, str) or not same(given, settings.token):
            settings.throttle.failed(client)
            return error(settings, request, 401, "wrong token: not logged in")
    finally:
        await form.close()
    settings.throttle.passed(client)
    settings.sessions.close(request.cookies.get(SESSION_COOKIE))
    response = redirect(request, "/", "logged in: actions are allowed")
    response.set_cookie(
        SESSION_COOKIE,
        settings.sessions.open(),
        httponly=True,
        samesite="strict",
        path=base(request) or "/",
        secure=request.url.scheme == "https",
    )
    return response


async def logout(settings: Settings, request: Request) -> Response:
    """End the session on the server: its cookie, copied or not, no longer logs anyone in."""
    form = await request.form()
    try:
        refused = forged(settings, request, form)
        if refused is not None:
            return error(settings, request, 403, refused)
    finally:
        await form.close()
    settings.sessions.close(request.cookies.get(SESSION_COOKIE))
    response = redirect(request, "/", "logged out")
    response.delete_cookie(SESSION_COOKIE, path=base(request) or "/")
    return response
