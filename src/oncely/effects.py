"""Once-per-key effects for any caller: a Celery, Dramatiq, RQ or arq task body, a webhook.

Every queue delivers at least once. `app.effect(key)` opens a transaction, claims `key` in the
ledger (`oncely_runs`), hands the body that session, and commits the body's writes together
with the claim. A duplicate finds the claim and skips the body; an exception rolls everything
back, claim included, so the redelivery runs clean.

The ledger's `job` column holds the effect's *scope*, written `@scope` (default `@effect`).
The `@` cannot start a job name, so effects never collide with scheduled jobs; the scope is
not the handler's name on purpose: renaming or moving a handler must not make old keys run
again. Give a scope only to keep two families of keys apart (`scope="emails"`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from . import events
from .errors import BadInputError, ConfigError, JobTransactionError
from .identity import replica_id
from .model import Claim, RunStatus
from .registry import session_first_signature
from .store import violation

if TYPE_CHECKING:
    from .app import Oncely

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_SCOPE = "effect"
MAX_KEY_LENGTH = 200
_SCOPE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,198}$")


@dataclass(frozen=True)
class EffectResult(Generic[R]):
    """What one call of a once-per-key effect came to."""

    scope: str
    key: str
    status: RunStatus
    """`ran` (the body ran and committed with the claim), `skipped` (a duplicate: the key
    was claimed before, the body did not run) or `failed` (the body raised: rolled back)."""
    duration: float
    value: R | None = None
    """What the body returned, for `ran`."""
    claim: Claim | None = None
    """For `skipped`: the claim that was already there (who processed the key, and when)."""
    error: BaseException | None = None

    @property
    def ran(self) -> bool:
        """Whether the body ran and its effects committed."""
        return self.status is RunStatus.RAN

    @property
    def skipped(self) -> bool:
        """Whether this was a duplicate and the body did not run."""
        return self.status is RunStatus.SKIPPED


def ledger_job(scope: str) -> str:
    """The `job` value in the ledger for an effect scope: `@scope`."""
    if not isinstance(scope, str) or not _SCOPE.match(scope):
        raise ConfigError(
            f"effect scope {scope!r} is not valid: use letters, digits, _ . : - "
            "(at most 199, starting with a letter or _)"
        )
    return "@" + scope


def check_key(key: object) -> str:
    """The key itself if it can be stored in the ledger, else BadInputError saying why."""
    if not isinstance(key, str) or not key:
        raise BadInputError(f"an effect key must be a non-empty str, got {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise BadInputError(
            f"effect key {key[:40]!r}… is {len(key)} characters, the ledger holds at most "
            f"{MAX_KEY_LENGTH}: use oncely.idempotency_key(...) for long or structured keys"
        )
    return key


class _EffectBase:
    def __init__(self, app: Oncely, key: str, scope: str, name: str | None = None) -> None:
        self.app = app
        self.key = check_key(key)
        self.scope = scope
        self.job = ledger_job(scope)
        self.name = name or scope
        """What metrics label the effect by: the once-handler's name, else the scope."""
        self.result: EffectResult[Any] | None = None
        """Set when the block ends: ran, skipped or failed."""
        self._started = 0.0

    def _fields(self) -> dict[str, Any]:
        return {"job": self.job, "key": self.key, "effect": self.name, "replica": replica_id()}

    def _done(self, status: RunStatus, **extra: Any) -> None:
        self.result = EffectResult(
            scope=self.scope,
            key=self.key,
            status=status,
            duration=time.perf_counter() - self._started,
            **extra,
        )

    def _skipped(self, claim: Claim | None) -> None:
        self._done(RunStatus.SKIPPED, claim=claim)
        events.emit(
            "effect.skipped",
            "already processed, skipping",
            claimed_by=claim.claimed_by if claim else None,
            claimed_at=claim.claimed_at.isoformat() if claim else None,
            **self._fields(),
        )

    def _failed(self, exc: BaseException, what: str) -> None:
        self._done(RunStatus.FAILED, error=exc)
        events.emit(
            "effect.failed",
            what,
            level=logging.ERROR,
            error=f"{type(exc).__name__}: {exc}",
            **self._fields(),
        )

    def _ran(self) -> None:
        self._done(RunStatus.RAN)
        assert self.result is not None
        events.emit(
            "effect.ran",
            "ran",
            duration_ms=round(self.result.duration * 1000, 1),
            **self._fields(),
        )


class Effect(_EffectBase):
    """`async with app.effect(key) as db:` — `db` is None for a duplicate (skip the work).

    The body's writes through `db` commit together with the key's claim when the block ends;
    an exception rolls both back and propagates (so the queue retries). After the block,
    `.result` says whether it ran or was skipped.
    """

    _stack: contextlib.AsyncExitStack
    _session: AsyncSession | None

    async def __aenter__(self) -> AsyncSession | None:
        self._started = time.perf_counter()
        store = self.app.store
        await store.ensure_schema()
        self._stack = contextlib.AsyncExitStack()
        session = await self._stack.enter_async_context(store.attempt())
        try:
            claimed = await store.claim_effect(session, self.job, self.key, replica_id())
            if not claimed:
                claim = await store.claim_in(session, self.job, self.key)
                await store.abandon(session)
                self._skipped(claim)
                self._session = None
                await self._stack.aclose()
                return None
        except BaseException:
            await store.abandon(session)
            await self._stack.aclose()
            raise
        self._session = session
        return session

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        session = self._session
        if session is None:
            return None
        store = self.app.store
        try:
            if exc is not None:
                await store.abandon(session)
                self._failed(exc, "the body raised; rolled back, the key is free")
                return None
            what = violation(session.sync_session)
            if what is not None:
                await store.abandon(session)
                error = JobTransactionError(f"the effect's body called {what}() on its session")
                self._failed(error, "the body ended oncely's transaction; rolled back")
                raise error
            try:
                await store.finish(session, self.job, self.key)
            except BaseException as commit_error:
                await store.abandon(session)
                self._failed(commit_error, "the commit failed; rolled back, the key is free")
                raise
            self._ran()
            return None
        finally:
            await self._stack.aclose()


class SyncEffect(_EffectBase):
    """`with app.effect_sync(key) as session:` — the synchronous twin of `Effect`.

    Runs on a synchronous engine for the app's database (psycopg2 for Postgres, the stdlib
    sqlite3 for SQLite), so it works in a Celery, RQ or Dramatiq worker without an event loop.
    """

    _session: Session | None

    def __enter__(self) -> Session | None:
        self._started = time.perf_counter()
        store = self.app.store
        session = store.sync_sessions()
        try:
            claimed = store.claim_effect_sync(session, self.job, self.key, replica_id())
            if not claimed:
                claim = store.claim_in_sync(session, self.job, self.key)
                store.abandon_sync(session)
                self._skipped(claim)
                self._session = None
                return None
        except BaseException:
            store.abandon_sync(session)
            raise
        self._session = session
        return session

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        session = self._session
        if session is None:
            return None
        store = self.app.store
        try:
            if exc is not None:
                self._failed(exc, "the body raised; rolled back, the key is free")
                return None
            what = violation(session)
            if what is not None:
                error = JobTransactionError(f"the effect's body called {what}() on its session")
                self._failed(error, "the body ended oncely's transaction; rolled back")
                raise error
            try:
                store.finish_sync(session, self.job, self.key)
            except BaseException as commit_error:
                self._failed(commit_error, "the commit failed; rolled back, the key is free")
                raise
            self._ran()
            return None
        finally:
            store.abandon_sync(session)


def _call_signature(func: Callable[..., Any]) -> inspect.Signature:
    name = getattr(func, "__qualname__", repr(func))
    sig = session_first_signature(
        func,
        f"@once {name}",
        "the function's first parameter receives the session "
        f"(e.g. def {getattr(func, '__name__', 'handler')}(db, order_id))",
    )
    params = list(sig.parameters.values())
    return sig.replace(parameters=params[1:], return_annotation=EffectResult)


class OnceHandler(Generic[P, R]):
    """A function made once-per-key by `@app.once(key=...)`; calling it returns an EffectResult.

    The function receives the session first, then the caller's arguments; `key` receives the
    caller's arguments and returns the key. `handler.__wrapped__` is the original function.
    """

    def __init__(
        self,
        app: Oncely,
        func: Callable[Concatenate[Any, P], Any],
        key: Callable[P, str],
        scope: str,
    ) -> None:
        self.app = app
        self.func = func
        self.key = key
        self.scope = scope
        self.is_async = inspect.iscoroutinefunction(func)
        self.name: str = getattr(func, "__qualname__", None) or repr(func)
        functools.update_wrapper(self, func)  # type: ignore[arg-type]
        # What callers (and Celery's argument check) see: the function without its session.
        self.__signature__ = _call_signature(func)

    def key_for(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """The key a call with these arguments claims."""
        return check_key(self.key(*args, **kwargs))


class AsyncOnceHandler(OnceHandler[P, R]):
    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> EffectResult[R]:
        effect = Effect(self.app, self.key_for(*args, **kwargs), self.scope, self.name)
        value: R | None = None
        async with effect as db:
            if db is not None:
                value = await self.func(db, *args, **kwargs)
        assert effect.result is not None
        return replace(effect.result, value=value)


class SyncOnceHandler(OnceHandler[P, R]):
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> EffectResult[R]:
        effect = SyncEffect(self.app, self.key_for(*args, **kwargs), self.scope, self.name)
        value: R | None = None
        with effect as session:
            if session is not None:
                value = self.func(session, *args, **kwargs)
        assert effect.result is not None
        return replace(effect.result, value=value)


class OnceDecorator:
    """What `app.once(key=...)` returns: applied to an async or a plain function."""

    def __init__(self, app: Oncely, key: Callable[..., str], scope: str) -> None:
        if not callable(key):
            raise ConfigError("once(key=...) must be a function of the handler's arguments")
        ledger_job(scope)
        self.app = app
        self.key = key
        self.scope = scope

    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, func: Callable[Concatenate[Any, P], Awaitable[R]]
    ) -> AsyncOnceHandler[P, R]: ...

    @overload
    def __call__(self, func: Callable[Concatenate[Any, P], R]) -> SyncOnceHandler[P, R]: ...

    def __call__(self, func: Callable[..., Any]) -> OnceHandler[Any, Any]:
        if not callable(func):
            raise ConfigError(f"@once: {func!r} is not callable")
        if inspect.iscoroutinefunction(func):
            return AsyncOnceHandler(self.app, func, self.key, self.scope)
        return SyncOnceHandler(self.app, func, self.key, self.scope)
