"""`Oncely` for Django: scheduled jobs `def job(now)` that use the ORM, configured from settings.

Each attempt runs in a worker thread inside `transaction.atomic(using=...)` on Django's
connection: the slot's claim first (oncely's lock-and-claim statement on that connection, so
a loser moves on at once on Postgres), then the job, then the stamp of its end; the block's
commit lands the ORM work and the claim together, and any exception rolls both back.

The worker also runs the `django.tasks` tasks of the oncely backend (`register_django_tasks`,
at the worker's start): each attempt in a worker thread, inside `transaction.atomic()` on the
app's database with the task's ack.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import DatabaseError as DjangoDatabaseError
from django.db import InterfaceError, OperationalError, close_old_connections, transaction

from ... import app as core
from ... import hooks
from ...errors import DatabaseError, DatabaseUnavailableError, OncelyError
from ...masking import mask_secrets
from ...model import RunStatus
from ...registry import Job, schedule_given
from ...runner import RAN, SlotOutcome, Stage, fate_writer, not_claimed
from ...schedule import Schedule
from ...store import ClaimAnswer, ClaimRequest, Store, borrowed
from .connection import database_url, default_alias, lent

F = TypeVar("F", bound=Callable[[datetime], Any])

_NOT_CLAIMED = {
    ClaimAnswer.BUSY: RunStatus.BUSY,
    ClaimAnswer.OVERLAP: RunStatus.OVERLAP,
    ClaimAnswer.TAKEN: RunStatus.SKIPPED,
    ClaimAnswer.GIVEN_UP: RunStatus.GIVEN_UP,
    ClaimAnswer.RETRY_WAIT: RunStatus.RETRY_WAIT,
}


class Oncely(core.Oncely):
    """An oncely app on a Django database (`using`, default `ONCELY["DATABASE"]` or
    "default"): jobs are `def job(now)` using the ORM; oncely's own reads and the worker's
    loops connect to the same database with the credentials in `settings.DATABASES`."""

    def __init__(self, using: str | None = None, **options: Any) -> None:
        super().__init__("sqlite://", **options)  # the real URL is read from settings on use
        self.using = using
        self._url_given = False

    @property
    def alias(self) -> str:
        """The Django database alias this app's jobs and claims use."""
        return self.using or default_alias()

    def use_database(self, database: core.Database) -> None:
        super().use_database(database)
        self._url_given = True

    @property
    def store(self) -> Store:
        if self._store is None and not self._url_given:
            self._database = database_url(self.alias)
        return super().store

    def register_django_tasks(self) -> list[str]:
        """Register, as oncely tasks of this app, the `django.tasks` tasks an oncely backend
        validated (after importing the `tasks` modules of INSTALLED_APPS and
        `ONCELY["TASK_MODULES"]`): named by their module path, with their queue and the
        backend's RetryPolicy and timeout, each attempt run by `tasks.attempt` on this
        app's database. The names registered now (again: none)."""
        from . import tasks as django_tasks

        added: list[str] = []
        for path, task in sorted(django_tasks.discover().items()):
            if self.tasks.find(path) is not None:
                continue
            backend = django_tasks.backend_for(task, self.alias)
            self.tasks.add(
                django_tasks.signature_shim(task),
                name=path,
                retry=backend.retry_policy(path, task),
                queue=task.queue_name,
                timeout=backend.timeout(path, task),
                attempt=functools.partial(django_tasks.attempt, self.alias),
            )
            added.append(path)
        return added

    async def work(self, **options: Any) -> None:
        """`Oncely.work`, with the Django tasks registered first (`register_django_tasks`)."""
        self.register_django_tasks()
        await super().work(**options)

    def job(  # type: ignore[override]
        self,
        schedule: Schedule,
        *,
        name: str | None = None,
        key: Callable[[datetime], str] | None = None,
        catch_up: str = "latest",
        grace: timedelta | None = None,
        overlap: str = "skip",
    ) -> Callable[[F], F]:
        """Register `f(now)` to run once per slot of `schedule`, inside
        `transaction.atomic(using=alias)` with the slot's claim; returning commits the ORM
        work and the claim, raising rolls both back and frees the slot."""
        schedule_given(schedule)

        def register(func: F) -> F:
            self.registry.add_job(
                schedule,
                func,  # type: ignore[arg-type]  # f(now): its attempt calls it so
                name=name,
                key=key,
                catch_up=catch_up,
                grace=grace,
                overlap=overlap,
                attempt=self._attempt,
            )
            return func

        return register

    async def _attempt(
        self, store: Store, job: Job, slot: datetime, request: ClaimRequest
    ) -> SlotOutcome:
        outcome = await asyncio.to_thread(attempt_in_django, self.alias, job, slot, request, store)
        if outcome.status is RunStatus.SKIPPED:
            await _record_duplicate(store, slot, request)
        return outcome


async def _record_duplicate(store: Store, slot: datetime, request: ClaimRequest) -> None:
    """A suppressed duplicate, as data (oncely_duplicates), as the plain app records it: what
    the dashboard counts. Best effort: a record that cannot be written leaves the outcome."""
    with contextlib.suppress(OncelyError):
        await store.control.duplicate(request.job, request.key, slot, request.claimed_by)


def attempt_in_django(
    alias: str, job: Job, slot: datetime, request: ClaimRequest, store: Store | None = None
) -> SlotOutcome:
    """One attempt at a slot on Django's connection `alias`: claim → call → commit (a job
    that raises: its work rolled back to the savepoint and the slot's fate recorded in the
    same transaction, as the runner does, where `store` can build the record)."""
    close_old_connections()
    try:
        return _attempt(alias, job, slot, request, store)
    finally:
        close_old_connections()


def _claim(alias: str, request: ClaimRequest) -> SlotOutcome | None:
    with lent(alias, f"job {request.job!r}") as conn:
        answer = borrowed.lock_and_claim(conn, request)
        if answer is ClaimAnswer.CLAIMED:
            return None
        taken = answer is ClaimAnswer.TAKEN
        claim = borrowed.claim_in(conn, request.job, request.key) if taken else None
    transaction.set_rollback(True, using=alias)
    return not_claimed(_NOT_CLAIMED[answer], claim)


def _record_fate(
    alias: str, store: Store | None, job: Job, slot: datetime, request: ClaimRequest, exc: Exception
) -> SlotOutcome:
    """A job that raised, in its open atomic block: its fate recorded there (given up, or
    retried by its policy), or, where that cannot be written, the block rolled back whole
    (the slot is free)."""
    failed = SlotOutcome(RunStatus.FAILED, Stage.CALL, error=exc)
    if store is None or not store.has_slot_fate or transaction.get_rollback(using=alias):
        transaction.set_rollback(True, using=alias)
        return failed

    def fate(outcome: SlotOutcome, *, final: bool, retry_at: datetime | None) -> tuple[Any, Any]:
        ended = {
            "job": request.job,
            "key": request.key,
            "slot": slot,
            "replica": request.claimed_by,
            "outcome": outcome.status.value,
            "started_at": None,
            "final": final or None,
            "retry_at": retry_at,
        }
        return store.control.fate_record(None, ended, outcome.error)

    write, decided = fate_writer(job, failed, fate, slot)
    try:
        with lent(alias, f"job {request.job!r}") as conn:
            borrowed.give_up(conn, request.job, request.key, write)
    except Exception:
        transaction.set_rollback(True, using=alias)
        return failed
    return decided(failed)


def _attempt(
    alias: str, job: Job, slot: datetime, request: ClaimRequest, store: Store | None = None
) -> SlotOutcome:
    stage = Stage.CLAIM
    try:
        with transaction.atomic(using=alias):
            outcome = _claim(alias, request)
            if outcome is not None:
                return outcome
            stage = Stage.CALL
            try:
                job.func(slot)  # type: ignore[call-arg, misc]
            except Exception as exc:
                return _record_fate(alias, store, job, slot, request, exc)
            stage = Stage.COMMIT
            with lent(alias, f"job {request.job!r}") as conn:
                borrowed.finish(conn, request.job, request.key)
            hooks.before_commit(request.job, request.key)
    except Exception as exc:
        if stage is Stage.CLAIM:  # oncely's own failure: the caller reports it
            raise _translated(alias, exc) from exc
        return SlotOutcome(RunStatus.FAILED, stage, error=exc)
    return RAN


def _translated(alias: str, exc: Exception) -> Exception:
    """A Django database error before the job ran, as an OncelyError (unreachable: the
    worker waits for the database and retries the slot; `oncely run` exits 2)."""
    if isinstance(exc, OncelyError) or not isinstance(exc, DjangoDatabaseError):
        return exc
    text = mask_secrets(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))
    if isinstance(exc, (OperationalError, InterfaceError)):
        return DatabaseUnavailableError(f"cannot reach Django's database {alias!r}: {text}")
    return DatabaseError(f"Django's database {alias!r}: {text}")
