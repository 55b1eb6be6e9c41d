"""Claims on Django's transaction: `claim(job, key)` and `@once(key=...)`.

The claim is oncely's own statement (`INSERT … ON CONFLICT DO NOTHING RETURNING 1` on
`oncely_runs`), run on Django's connection inside the caller's `transaction.atomic()`: it
commits with the ORM work or not at all, and a rollback frees it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Generic, ParamSpec, TypeVar

from django.db import transaction

from ... import hooks
from ...effects import DEFAULT_SCOPE, EffectResult, check_key, ledger_job
from ...errors import ConfigError
from ...identity import replica_id
from ...model import RunStatus
from ...runner import RAN, SlotOutcome, Stage, not_claimed, report
from ...store import borrowed
from .connection import default_alias, lent

P = ParamSpec("P")
R = TypeVar("R")


def claim(job: str, key: str, using: str | None = None) -> bool:
    """Claim (job, key) in the open `transaction.atomic(using=...)` block; True if it is ours.

    False means the key was claimed (and committed) before: skip the work. If another
    transaction holds an uncommitted claim of the same key, this waits for it to end.
    Outside an atomic block it raises BadInputError and sends nothing.
    """
    alias = using or default_alias()
    with lent(alias, f"claim({job!r}, {key!r})") as conn:
        return borrowed.claim(conn, job, key)


class DjangoOnceHandler(Generic[P, R]):
    """A function made once-per-key by `@once(key=...)`; calling it returns an EffectResult.

    Each call opens `transaction.atomic(using=...)`, claims the key, calls the function and
    commits both; a duplicate is skipped (`effect.skipped`, with who processed it), an
    exception rolls both back and propagates. `__wrapped__` is the original function.
    """

    def __init__(
        self, func: Callable[P, R], key: Callable[P, str], scope: str, using: str | None
    ) -> None:
        self.func = func
        self.key = key
        self.scope = scope
        self.job = ledger_job(scope)
        self.using = using
        self.name: str = getattr(func, "__qualname__", None) or repr(func)
        functools.update_wrapper(self, func)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> EffectResult[R]:
        key = check_key(self.key(*args, **kwargs))
        alias = self.using or default_alias()
        started = time.perf_counter()
        value: R | None = None
        outcome: SlotOutcome = RAN
        stage = Stage.CLAIM
        try:
            with transaction.atomic(using=alias):
                with lent(alias, f"@once {self.name}") as conn:
                    claimed = borrowed.claim(conn, self.job, key)
                    taken = None if claimed else borrowed.claim_in(conn, self.job, key)
                if claimed:
                    stage = Stage.CALL
                    value = self.func(*args, **kwargs)
                    stage = Stage.COMMIT
                    hooks.before_commit(self.job, key)
                else:
                    outcome = not_claimed(RunStatus.SKIPPED, taken)
        except BaseException as exc:
            if stage is not Stage.CLAIM:  # oncely's own failure to claim is not the body's
                self._report(key, SlotOutcome(RunStatus.FAILED, stage, error=exc), started)
            raise
        result = self._report(key, outcome, started)
        return replace(result, value=value)

    def _report(self, key: str, outcome: SlotOutcome, started: float) -> EffectResult[Any]:
        duration = time.perf_counter() - started
        fields = {"job": self.job, "key": key, "effect": self.name, "replica": replica_id()}
        report("effect", outcome, duration, fields)
        return EffectResult(
            scope=self.scope,
            key=key,
            status=outcome.status,
            duration=duration,
            claim=outcome.claim,
            error=outcome.error,
        )


def once(
    key: Callable[..., str], *, scope: str = DEFAULT_SCOPE, using: str | None = None
) -> Callable[[Callable[P, R]], DjangoOnceHandler[P, R]]:
    """Make a Django function (a view's helper, a signal handler, a Celery task) take effect
    once per `key(*args, **kwargs)`, on Django's transaction (`using`: the database alias).

    The function takes the caller's arguments as they are (no session: it uses the ORM).
    """
    if not callable(key):
        raise ConfigError("once(key=...) must be a function of the handler's arguments")
    ledger_job(scope)

    def decorate(func: Callable[P, R]) -> DjangoOnceHandler[P, R]:
        if not callable(func):
            raise ConfigError(f"@once: {func!r} is not callable")
        return DjangoOnceHandler(func, key, scope, using)

    return decorate
