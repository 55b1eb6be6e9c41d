"""Who may do what on the dashboard: the permission resolver, the token, the CSRF token.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Union

from starlette.requests import Request

ACTIONS = frozenset(
    {
        "pause",
        "resume",
        "run",
        "backfill",
        "release",
        "cancel",
        "task_retry",
        "task_discard",
        "task_cancel",
    }
)
"""Every action the dashboard can take (a job's, then a task's); a resolver's set names some."""

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


def session_value(token: str, key: bytes) -> str:
    """The session cookie of a token login: a MAC of the token, never the token itself."""
    return hmac.new(key, token.encode("utf-8"), hashlib.sha256).hexdigest()


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def token_resolver(token: str | None, *, allow_actions: bool, key: bytes) -> Resolver:
    """The resolver of `oncely web`: read-only, or with `token` every action for a request
    that carries it (`Authorization: Bearer T` or the session cookie of `POST /login`)."""

    def resolver(request: Request) -> Permission:
        if token is None or not allow_actions:
            return "read"
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and same(value.strip(), token):
            return Grant("all", actor=f"web:token@{_client(request)}")
        cookie = request.cookies.get(SESSION_COOKIE)
        if same(cookie, session_value(token, key)):
            return Grant("all", actor=f"web:token@{_client(request)}")
        return "read"

    return resolver


def _client(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"
