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
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from .errors import BadInputError, ConfigError
from .identity import replica_id
from .model import Claim, RunStatus
from .registry import session_first_signature
from .runner import RAN, SlotOutcome, Stage, after_call, commit, not_claimed, report
from .store import Store

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
    def __init__(self, store: Store, key: str, scope: str, name: str | None = None) -> None:
        self.store = store
        self.key = check_key(key)
        self.scope = scope
        self.job = ledger_job(scope)
        self.name = name or scope
        """What metrics label the effect by: the once-handler's name, else the scope."""
        self.result: EffectResult[Any] | None = None
        """Set when the block ends: ran, skipped or failed."""
        self._started = 0.0

    def _end(self, outcome: SlotOutcome) -> None:
        """Record what the attempt came to as `.result`, and report its one event."""
        duration = time.perf_counter() - self._started
        self.result = EffectResult(
            scope=self.scope,
            key=self.key,
            status=outcome.status,
            duration=duration,
            claim=outcome.claim,
            error=outcome.error,
        )
        fields = {"job": self.job, "key": self.key, "effect": self.name, "replica": replica_id()}
        report("effect", outcome, duration, fields)

    def _ended(self, outcome: SlotOutcome) -> None:
        """`_end`, then raise what oncely itself stopped the block for (the body's own
        exception propagates by itself)."""
        self._end(outcome)
        if outcome.stage is not Stage.CALL and outcome.error is not None:
            raise outcome.error


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
        store = self.store
        await store.ensure_schema()
        self._stack = contextlib.AsyncExitStack()
        session = await self._stack.enter_async_context(store.claims.attempt())
        self._session = None
        try:
            claimed = await store.claims.claim_effect(session, self.job, self.key, replica_id())
            claim = None if claimed else await store.claims.claim_in(session, self.job, self.key)
            self._session = session if claimed else None
        finally:
            if self._session is None:  # a duplicate, or the claim failed
                await store.claims.abandon(session)
                await self._stack.aclose()
        if self._session is None:
            self._end(not_claimed(RunStatus.SKIPPED, claim))
        return self._session

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        session = self._session
        if session is None:
            return
        try:
            outcome = after_call(session.sync_session, exc, "the effect's body")
            if outcome is None:
                outcome = await commit(self.store, session, self.job, self.key, catch=BaseException)
            else:
                await self.store.claims.abandon(session)
            self._ended(outcome)
        finally:
            await self._stack.aclose()


class SyncEffect(_EffectBase):
    """`with app.effect_sync(key) as session:` — `Effect` for synchronous code.

    Runs on a synchronous engine for the app's database (psycopg2 for Postgres, the stdlib
    sqlite3 for SQLite), so it works in a Celery, RQ or Dramatiq worker without an event loop.
    """

    _session: Session | None

    def __enter__(self) -> Session | None:
        self._started = time.perf_counter()
        store = self.store
        session = store.sync_sessions()
        self._session = None
        try:
            claimed = store.claims.claim_effect_sync(session, self.job, self.key, replica_id())
            claim = None if claimed else store.claims.claim_in_sync(session, self.job, self.key)
            self._session = session if claimed else None
        finally:
            if self._session is None:  # a duplicate, or the claim failed
                store.claims.abandon_sync(session)
        if self._session is None:
            self._end(not_claimed(RunStatus.SKIPPED, claim))
        return self._session

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        session = self._session
        if session is None:
            return
        try:
            outcome = after_call(session, exc, "the effect's body")
            if outcome is None:
                try:
                    self.store.claims.finish_sync(session, self.job, self.key)
                    outcome = RAN
                except BaseException as commit_error:
                    outcome = SlotOutcome(RunStatus.FAILED, Stage.COMMIT, error=commit_error)
            self._ended(outcome)
        finally:
            self.store.claims.abandon_sync(session)


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
    `store` gives the app's store when a call needs it (after the app's database is set).
    """

    def __init__(
        self,
        store: Callable[[], Store],
        func: Callable[Concatenate[Any, P], Any],
        key: Callable[P, str],
        scope: str,
    ) -> None:
        self.store = store
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
        effect = Effect(self.store(), self.key_for(*args, **kwargs), self.scope, self.name)
        value: R | None = None
        async with effect as db:
            if db is not None:
                value = await self.func(db, *args, **kwargs)
        assert effect.result is not None
        return replace(effect.result, value=value)


class SyncOnceHandler(OnceHandler[P, R]):
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> EffectResult[R]:
        effect = SyncEffect(self.store(), self.key_for(*args, **kwargs), self.scope, self.name)
        value: R | None = None
        with effect as session:
            if session is not None:
                value = self.func(session, *args, **kwargs)
        assert effect.result is not None
        return replace(effect.result, value=value)


class OnceDecorator:
    """What `app.once(key=...)` returns: applied to an async or a plain function."""

    def __init__(self, store: Callable[[], Store], key: Callable[..., str], scope: str) -> None:
        if not callable(key):
            raise ConfigError("once(key=...) must be a function of the handler's arguments")
        ledger_job(scope)
        self.store = store
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
            return AsyncOnceHandler(self.store, func, self.key, self.scope)
        return SyncOnceHandler(self.store, func, self.key, self.scope)
