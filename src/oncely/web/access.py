"""Who may do what on the dashboard: the permission resolver, the token's sessions, the
login throttle.

A resolver is `(request) -> "read" | "all" | set of action names | Grant | None`, sync or
async. `None` refuses every page (403); "read" shows the pages and refuses every action;
"all" allows every action; a set allows the actions it names. A `Grant` says the same and
also names the actor that the audit rows record (default: `web@<client address>`).
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Union

from starlette.requests import Request

ACTIONS = frozenset(
    {
        "pause",
        "resume",
        "run",
        "backfill",
        "release",
        "skip",
        "cancel",
        "task_retry",
        "task_discard",
        "task_cancel",
        "schedule_add",
        "schedule_edit",
        "schedule_pause",
        "schedule_resume",
        "schedule_remove",
        "schedule_run",
    }
)
"""Every action the dashboard can take (a job's, a task's, then a data schedule's); a
resolver's set names some."""

SESSION_COOKIE = "oncely_session"
CSRF_COOKIE = "oncely_csrf"


@dataclass(frozen=True)
class Grant:
    """What a request may do (`"read"`, `"all"` or a set of action names) and who it is."""

    allow: str | frozenset[str] | set[str]
    actor: str | None = None


Permission = Union[str, set[str], frozenset[str], Grant, None]  # noqa: UP007 - py3.10 alias
Resolver = Callable[[Request], Union[Permission, Awaitable[Permission]]]  # noqa: UP007


@dataclass(frozen=True)
class Access:
    """A resolved permission: the actions allowed and the actor of the audit rows."""

    actions: frozenset[str]
    actor: str

    def may(self, action: str) -> bool:
        return action in self.actions

    @property
    def can_act(self) -> bool:
        return bool(self.actions)


def read_only(_request: Request) -> Permission:
    """The default resolver: every page, no action."""
    return "read"


def _actions(allow: object) -> frozenset[str]:
    if allow == "read":
        return frozenset()
    if allow == "all":
        return ACTIONS
    if isinstance(allow, (set, frozenset)):
        unknown = set(allow) - ACTIONS
        if unknown:
            raise ValueError(
                f"unknown dashboard actions {sorted(unknown)}; the actions are {sorted(ACTIONS)}"
            )
        return frozenset(allow)
    raise ValueError(
        f"a permission resolver returns 'read', 'all', a set of actions, a Grant or None; "
        f"got {allow!r}"
    )


def default_actor(request: Request) -> str:
    """The audit trail's actor when the resolver names none: the client's address."""
    host = request.client.host if request.client is not None else "unknown"
    return f"web@{host}"


async def resolve(resolver: Resolver, request: Request) -> Access | None:
    """Ask the resolver about one request; None: refused."""
    answer = resolver(request)
    if inspect.isawaitable(answer):
        answer = await answer
    if answer is None:
        return None
    if isinstance(answer, Grant):
        actor = answer.actor or default_actor(request)
        return Access(_actions(answer.allow), actor)
    return Access(_actions(answer), default_actor(request))


def same(given: str | None, expected: str) -> bool:
    """Whether a secret matches, in constant time."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def mac(key: bytes, value: str) -> str:
    """A keyed MAC of `value` (hex): what a CSRF token is, bound to its session."""
    return hmac.new(key, value.encode("utf-8"), hashlib.sha256).hexdigest()


def new_secret() -> str:
    return secrets.token_urlsafe(32)


SESSION_TTL = 12 * 3600.0
"""Seconds a login lasts at most (then the token is asked again)."""
SESSIONS_MAX = 1000
"""Live logins one dashboard keeps at most; past it, the oldest one ends."""


@dataclass
class Sessions:
    """The token logins of one dashboard, held server-side (in this process's memory): the
    cookie is a random id, worth something only while it is in here. Logout removes it, so
    a copied cookie stops working; a restart of the process ends every login."""

    ttl: float = SESSION_TTL
    limit: int = SESSIONS_MAX
    _opened: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def open(self) -> str:
        """A new login's id (never one a browser presented: no session fixation)."""
        sid = new_secret()
        self._opened[sid] = time.monotonic()
        while len(self._opened) > self.limit:
            self._opened.popitem(last=False)
        return sid

    def alive(self, sid: str | None) -> bool:
        if not sid or sid not in self._opened:
            return False
        if time.monotonic() - self._opened[sid] > self.ttl:
            del self._opened[sid]
            return False
        return True

    def close(self, sid: str | None) -> None:
        if sid:
            self._opened.pop(sid, None)


LOGIN_FAILURES = 5
"""Wrong tokens one client may send per LOGIN_WINDOW before its logins are refused."""
LOGIN_WINDOW = 60.0
LOGIN_CLIENTS = 4096
"""Clients the throttle remembers at most (the oldest is forgotten first): bounded memory."""


@dataclass
class LoginThrottle:
    """Wrong tokens per client address: after LOGIN_FAILURES in LOGIN_WINDOW seconds, that
    client's logins are refused (even with the right token) until the window ends."""

    failures: int = LOGIN_FAILURES
    window: float = LOGIN_WINDOW
    limit: int = LOGIN_CLIENTS
    _seen: OrderedDict[str, tuple[float, int]] = field(default_factory=OrderedDict)

    def wait(self, client: str) -> float:
        """Seconds until `client` may try again (0: now)."""
        seen = self._seen.get(client)
        if seen is None:
            return 0.0
        left = seen[0] + self.window - time.monotonic()
        if left <= 0:
            del self._seen[client]
            return 0.0
        return left if seen[1] >= self.failures else 0.0

    def failed(self, client: str) -> None:
        now = time.monotonic()
        start, count = self._seen.pop(client, (now, 0))
        if now - start > self.window:
            start, count = now, 0
        self._seen[client] = (start, count + 1)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def passed(self, client: str) -> None:
        self._seen.pop(client, None)


def bearer(request: Request) -> str | None:
    """The token of the request's `Authorization: Bearer …` header (None: it has none)."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    token = value.strip()
    return token if scheme.lower() == "bearer" and token else None


def scripted(request: Request) -> bool:
    """Whether the request is a script's: it carries a bearer token and no cookie at all. A
    browser never adds an `Authorization: Bearer` header by itself (a page of another origin
    cannot add one without a CORS preflight the dashboard never answers), so such a request
    needs no CSRF token; one that carries a cookie is a browser's session and does."""
    return bearer(request) is not None and not request.headers.get("cookie")


def token_resolver(token: str | None, *, allow_actions: bool, sessions: Sessions) -> Resolver:
    """The resolver of `oncely web`: read-only, or with `token` every action for a request
    that carries it (`Authorization: Bearer T`) or a live session of `POST /login`."""

    def resolver(request: Request) -> Permission:
        if token is None or not allow_actions:
            return "read"
        if same(bearer(request), token):
            return Grant("all", actor=f"web:token@{client_of(request)}")
        if sessions.alive(request.cookies.get(SESSION_COOKIE)):
            return Grant("all", actor=f"web:token@{client_of(request)}")
        return "read"

    return resolver


def client_of(request: Request) -> str:
    """The client's address (the login throttle's and the default actor's key)."""
    return request.client.host if request.client is not None else "unknown"
