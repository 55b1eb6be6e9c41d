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
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..app import Oncely
from . import actions, pages
from .access import (
    ACTIONS,
    SESSION_COOKIE,
    Access,
    Grant,
    Permission,
    Resolver,
    new_secret,
    read_only,
    same,
    session_value,
    token_resolver,
)
from .render import Redactor, Settings, base, csrf_ok, error, page, redirect

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
    if permissions is None:
        permissions = token_resolver(token, allow_actions=True, key=key) if token else read_only
    settings = Settings(app=app, resolver=permissions, redact=redact, key=key, token=token)
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
        Route("/jobs/{job}", bind(pages.job_page)),
        post("/jobs/{job}/pause", "pause", actions.pause),
        post("/jobs/{job}/resume", "resume", actions.resume),
        post("/jobs/{job}/run", "run", actions.run),
        post("/jobs/{job}/backfill", "backfill", actions.backfill),
        post("/jobs/{job}/release", "release", actions.release),
        post("/jobs/{job}/cancel", "cancel", actions.cancel),
        Route("/tasks", bind(pages.tasks_page)),
        post("/tasks/bulk", None, actions.bulk),
        Route("/tasks/{task_id}", bind(pages.task_page)),
        post("/tasks/{task_id}/retry", "task_retry", actions.task_action("retry")),
        post("/tasks/{task_id}/discard", "task_discard", actions.task_action("discard")),
        post("/tasks/{task_id}/cancel", "task_cancel", actions.task_action("cancel")),
        Route("/audit", bind(pages.audit_page)),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    return Starlette(routes=routes)


async def healthz(_request: Request) -> Response:
    return PlainTextResponse("ok")


async def login_form(settings: Settings, request: Request) -> Response:
    granted = await pages.guard(settings, request)
    if not isinstance(granted, Access):
        return granted
    return page(settings, request, "login.html", granted, configured=settings.token is not None)


async def login(settings: Settings, request: Request) -> Response:
    """Exchange the token for an HttpOnly, SameSite=Strict session cookie."""
    form = await request.form()
    try:
        if not csrf_ok(request, form):
            return error(settings, request, 403, "missing or wrong CSRF token: not logged in")
        given = form.get("token")
        if settings.token is None:
            return error(settings, request, 403, "this dashboard has no token: it is read-only")
        if not isinstance(given, str) or not same(given, settings.token):
            return error(settings, request, 401, "wrong token: not logged in")
    finally:
        await form.close()
    response = redirect(request, "/", "logged in: actions are allowed")
    response.set_cookie(
        SESSION_COOKIE,
        session_value(settings.token, settings.key),
        httponly=True,
        samesite="strict",
        path=base(request) or "/",
        secure=request.url.scheme == "https",
    )
    return response


async def logout(settings: Settings, request: Request) -> Response:
    form = await request.form()
    try:
        if not csrf_ok(request, form):
            return error(settings, request, 403, "missing or wrong CSRF token: nothing changed")
    finally:
        await form.close()
    response = redirect(request, "/", "logged out")
    response.delete_cookie(SESSION_COOKIE, path=base(request) or "/")
    return response
