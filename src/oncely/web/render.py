"""The dashboard's shared plumbing: its settings, the templates, access and CSRF checks, and
the responses every page returns (a page, an error page, a redirect with a flash message)."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ..app import Oncely
from ..masking import mask_secrets
from .access import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    Access,
    LoginThrottle,
    Resolver,
    Sessions,
    bearer,
    client_of,
    mac,
    new_secret,
    resolve,
    same,
    scripted,
)
from .words import MARK_WORDS

FLASH_COOKIE = "oncely_flash"
READS_AT_ONCE = 4
"""Reads one page runs concurrently at most (each on a connection of the app's pool)."""
Redactor = Callable[[str, dict[str, object]], object]
"""`redact(task_name, args) -> what the pages show of the arguments`."""


@dataclass
class Settings:
    """What one mounted dashboard is configured with."""

    app: Oncely
    resolver: Resolver
    redact: Redactor | None
    key: bytes
    token: str | None = None
    title: str = "oncely"
    sessions: Sessions = field(default_factory=Sessions)
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    env: jinja2.Environment = field(init=False)

    def __post_init__(self) -> None:
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("oncely.web", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            auto_reload=False,  # templates ship in the package: no stat per render
        )
        self.env.filters["iso"] = iso
        self.env.filters["ms"] = ms
        self.env.filters["mask"] = mask_secrets
        self.env.filters["number"] = lambda n: f"{n:,}"
        self.env.globals["mark_words"] = MARK_WORDS


def iso(t: datetime | None) -> str:
    """A time as the pages show it: ISO 8601, to the second, with its offset."""
    return t.isoformat(timespec="seconds") if t is not None else "-"


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def base(request: Request) -> str:
    """The URL prefix the dashboard is mounted under ('' at the root)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _nonce(request: Request) -> tuple[str, bool]:
    """This browser's CSRF nonce (its cookie) and whether it is new (to be set)."""
    value = request.cookies.get(CSRF_COOKIE)
    if value:
        return value, False
    value = request.scope.get("oncely.csrf")
    if value:
        return str(value), True
    value = new_secret()
    request.scope["oncely.csrf"] = value
    return value, True


def csrf_token(settings: Settings, request: Request) -> str:
    """The CSRF token the forms carry: a MAC, under the dashboard's key, of the request's
    live login session (else of this browser's nonce cookie). A page on another origin of
    the same site can set a cookie, but not learn the key nor the HttpOnly session id."""
    sid = request.cookies.get(SESSION_COOKIE)
    if settings.sessions.alive(sid):
        return mac(settings.key, f"session:{sid}")
    return mac(settings.key, f"nonce:{_nonce(request)[0]}")


def cross_origin(request: Request) -> bool:
    """Whether the browser says this request comes from another origin (`Sec-Fetch-Site`;
    from a browser too old to send it, `Origin` against the `Host` it was sent to). A
    client that sends neither (curl, a script with a bearer token) is no browser a page
    can drive."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:  # no page can set it; a proxy that rewrites Host leaves it be
        return site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return False
    netloc = urllib.parse.urlsplit(origin).netloc.lower()
    return not netloc or netloc != request.headers.get("host", "").lower()


def forged(settings: Settings, request: Request, form: Any) -> str | None:
    """Why a POST is refused as not the dashboard's own form (None: it is): another
    origin sent it, or it lacks the CSRF token of its session. A script's request (a bearer
    token, no cookie: `access.scripted`) needs no CSRF token; whether its token is good is
    the resolver's to say."""
    if cross_origin(request):
        return "refused: a page of another origin sent this request: nothing changed"
    if scripted(request):
        return None
    given = form.get("csrf")
    if not isinstance(given, str) or not same(given, csrf_token(settings, request)):
        return "missing or wrong CSRF token: nothing changed (reload the page and retry)"
    return None


def _finish(request: Request, response: Response) -> Response:
    nonce, fresh = _nonce(request)
    if fresh:
        response.set_cookie(
            CSRF_COOKIE,
            nonce,
            httponly=True,
            samesite="strict",
            path=base(request) or "/",
            secure=request.url.scheme == "https",
        )
    if request.cookies.get(FLASH_COOKIE) and request.method == "GET":
        response.delete_cookie(FLASH_COOKIE, path=base(request) or "/")
    return response


def page(
    settings: Settings,
    request: Request,
    template: str,
    access: Access | None,
    status: int = 200,
    **context: Any,
) -> Response:
    """Render a page (with the flash message of the redirect that led here, if any)."""
    flash = request.cookies.get(FLASH_COOKIE) if request.method == "GET" else None
    html = settings.env.get_template(template).render(
        base=base(request),
        csrf=csrf_token(settings, request),
        access=access,
        title=settings.title,
        flash=urllib.parse.unquote(flash) if flash else None,
        database=settings.app.store.display_url,
        login=settings.token is not None,
        **context,
    )
    return _finish(request, HTMLResponse(html, status_code=status))


def error(
    settings: Settings, request: Request, status: int, message: str, access: Access | None = None
) -> Response:
    """An error page: the message (credentials masked) in `data-testid="error"`."""
    return page(
        settings, request, "error.html", access, status=status, message=mask_secrets(message)
    )


def throttled(settings: Settings, request: Request, client: str, what: str) -> Response | None:
    """429 for a client throttled for too many wrong tokens (`what`: what became of its
    request), or None."""
    wait = settings.throttle.wait(client)
    if not wait:
        return None
    return error(
        settings,
        request,
        429,
        f"too many wrong tokens from {client}: {what}; try again in {wait:.0f} s",
    )


def wrong_token(settings: Settings, request: Request) -> Response | None:
    """The refusal of a request whose bearer token is not the dashboard's own `token`
    (401), or from a client throttled for too many wrong tokens (429, the right one too),
    as `POST /login` is; None: no bearer token, a resolver of the host app's, or the right
    token."""
    given = bearer(request)
    if given is None or settings.token is None:
        return None
    client = client_of(request)
    refused = throttled(settings, request, client, "refused (nothing changed)")
    if refused is not None:
        return refused
    if not same(given, settings.token):
        settings.throttle.failed(client)
        return error(settings, request, 401, "wrong bearer token: refused (nothing changed)")
    settings.throttle.passed(client)
    return None


def redirect(request: Request, to: str, flash: str) -> Response:
    """303 to `to` (under the mount), with a flash message for the page it lands on."""
    response = RedirectResponse(base(request) + to, status_code=303)
    response.set_cookie(
        FLASH_COOKIE,
        urllib.parse.quote(mask_secrets(flash)[:500]),
        httponly=True,
        samesite="strict",
        path=base(request) or "/",
        max_age=60,
    )
    return response


async def access_of(settings: Settings, request: Request) -> Access | None:
    return await resolve(settings.resolver, request)


def pretty(value: object) -> str:
    """JSON, indented, for the task pages (anything JSON cannot write is shown as text)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


async def gather(*reads: Awaitable[Any]) -> list[Any]:
    """Run a page's independent reads concurrently, at most READS_AT_ONCE at a time."""
    limit = asyncio.Semaphore(READS_AT_ONCE)

    async def one(read: Awaitable[Any]) -> Any:
        async with limit:
            return await read

    return list(await asyncio.gather(*(one(r) for r in reads)))
