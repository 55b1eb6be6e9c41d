"""The queue worker: fetch due tasks with a lease, run each with its ack, retry per policy.

`consume(app, stopping)` runs `concurrency` lanes. A lane leases a batch of due tasks (one
short transaction: the attempt counts even if the worker dies), then runs the batch in ONE
transaction where every task gets a savepoint of its own: the task's work and its ack (a
compare-and-set on (id, lease token)) share that savepoint, so they commit together or not at
all. A task that raises rolls back to its savepoint and its retry or end is recorded in the same
transaction; one commit lands the whole batch. Leases are in database time; a heartbeat renews
them while tasks run and a rescuer hands tasks whose lease ran out (their worker died) to
another worker. Postgres wakes idle lanes with LISTEN/NOTIFY; polling is the fallback.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
import traceback
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from . import clock, events
from .errors import BadInputError, DatabaseUnavailableError, OncelyError, TaskStateError
from .identity import replica_id
from .model import TaskRecord, TaskState
from .retry import DEFAULT_POLICY, Discard, GiveUp, Retry, RetryPolicy
from .store.session import hand_back, violation
from .store.task_store import Batch, Leased
from .tasks import Task

if TYPE_CHECKING:
    from .app import Oncely

logger = logging.getLogger("oncely")

DEFAULT_LEASE = 30.0
"""Seconds a worker holds a task before another may take it over; heartbeats renew it."""
DEFAULT_CONCURRENCY = 10
DEFAULT_BATCH = 50
"""Tasks per transaction; under Postgres' 64 cached subtransactions per transaction."""
DEFAULT_POLL = 1.0


class LeaseLost(OncelyError):
    """Another worker took this task over after its lease ran out; this attempt rolled back."""


def _error_text(exc: BaseException) -> str:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{type(exc).__name__}: {exc}\n{tb}"


class _Lane:
    """One connection that leases and runs batches, one at a time."""

    def __init__(self, worker: Worker, number: int) -> None:
        self.worker = worker
        self.number = number

    async def run(self, stopping: asyncio.Event) -> None:
        worker = self.worker
        while not stopping.is_set():
            try:
                async with worker.lanes.connect() as conn:
                    await self._loop(conn, stopping)
            except (DatabaseUnavailableError, OSError) as exc:
                events.emit(
                    "worker.db_error",
                    "database unavailable; retrying",
                    level=logging.WARNING,
                    error=str(exc),
                )
                await worker.pause(stopping, 1.0)
            except OncelyError as exc:
                if worker.store.dialect.is_busy(exc.__cause__ or exc):
                    await worker.pause(stopping, 0.05)
                    continue
                events.emit(
                    "worker.error", "lane failed; restarting", level=logging.ERROR, error=str(exc)
                )
                await worker.pause(stopping, 1.0)

    async def _loop(self, conn: AsyncConnection, stopping: asyncio.Event) -> None:
        worker = self.worker
        while not stopping.is_set():
            leased = await worker.store.tasks.fetch(
                conn, worker.queues, worker.batch, worker.token(), worker.by, worker.lease
            )
            if not leased:
                await worker.idle(stopping)
                continue
            while leased:
                if len(leased) == worker.batch:
                    worker.notify()  # a full batch: there may be more, wake one more lane
                leased = await worker.run_batch(conn, leased, stopping)


class Worker:
    """Runs an app's tasks: lanes, heartbeat, rescuer and wake-ups."""

    def __init__(
        self,
        app: Oncely,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease: float | None = None,
        queues: Sequence[str] | None = None,
        batch: int = DEFAULT_BATCH,
        poll: float = DEFAULT_POLL,
    ) -> None:
        if concurrency < 1:
            raise BadInputError(f"concurrency must be >= 1, got {concurrency}")
        lease = float(lease if lease is not None else getattr(app, "lease", DEFAULT_LEASE))
        if lease <= 0:
            raise BadInputError(f"the lease must be > 0 seconds, got {lease}")
        if batch < 1:
            raise BadInputError(f"batch must be >= 1, got {batch}")
        self.app = app
        self.store = app.store
        self.concurrency = concurrency
        self.lease = lease
        self.queues = list(queues) if queues else None
        self.batch = batch
        self.poll = poll
        self.by = replica_id()
        self._sleepers: collections.deque[asyncio.Event] = collections.deque()
        self._pending = False
        self.lanes = self.store.engine
        """Where lanes (and the listener) get their long-lived connections."""
        self.held: dict[int, Leased] = {}
        """Leased tasks not yet finished: what the heartbeat renews."""
        self._prefix = uuid.uuid4().hex[:16]
        self._counter = itertools.count()

    def token(self) -> str:
        """A lease token for one fetch: unique to this worker and this fetch."""
        return f"{self._prefix}.{next(self._counter)}"

    def notify(self) -> None:
        """New tasks may be due: wake one idle lane (it wakes the next if it finds plenty).

        Waking one, not all, keeps idle lanes from racing for a single new task.
        """
        while self._sleepers:
            sleeper = self._sleepers.popleft()
            if not sleeper.is_set():
                sleeper.set()
                return
        self._pending = True  # every lane is busy: the next one to go idle looks again first

    async def idle(self, stopping: asyncio.Event) -> None:
        """Wait for a notification, the stop signal, or the poll interval."""
        if self._pending:
            self._pending = False
            return
        woken = asyncio.Event()
        self._sleepers.append(woken)
        waiters = [asyncio.ensure_future(woken.wait()), asyncio.ensure_future(stopping.wait())]
        try:
            await asyncio.wait(waiters, timeout=self.poll, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            with contextlib.suppress(ValueError):
                self._sleepers.remove(woken)

    async def pause(self, stopping: asyncio.Event, seconds: float) -> None:
        """Sleep `seconds` unless asked to stop first."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), seconds)

    # -- running ------------------------------------------------------------------------

    async def consume(self, stopping: asyncio.Event) -> None:
        """Run until `stopping` is set and in-flight batches finish; cancelling rolls them back."""
        await self.store.ensure_schema()
        self.lanes = self.store.dedicated_engine()
        try:
            await self._consume(stopping)
        finally:
            if self.lanes is not self.store.engine:
                await self.lanes.dispose()

    async def _consume(self, stopping: asyncio.Event) -> None:
        async with self.store.dialect.listener(self.lanes, self.notify):
            helpers = [
                asyncio.create_task(self._heartbeat(stopping)),
                asyncio.create_task(self._rescuer(stopping)),
            ]
            lanes = [
                asyncio.create_task(_Lane(self, i).run(stopping)) for i in range(self.concurrency)
            ]
            try:
                await asyncio.gather(*lanes)
            finally:
                for lane in lanes:
                    lane.cancel()
                for helper in helpers:
                    helper.cancel()
                await asyncio.gather(*lanes, *helpers, return_exceptions=True)
                await self._give_back()

    async def _give_back(self) -> None:
        if not self.held:
            return
        leftover = list(self.held.values())
        self.held.clear()
        with contextlib.suppress(Exception):
            await asyncio.shield(self.store.tasks.release(leftover, started=True))

    async def run_batch(
        self, conn: AsyncConnection, leased: list[Leased], stopping: asyncio.Event | None = None
    ) -> list[Leased]:
        """Run leased tasks in one transaction, each in its own savepoint with its own ack.

        Unless `stopping` is set, the same transaction leases the next batch, which it returns
        (empty if the transaction failed: those leases rolled back with it).
        """
        for item in leased:
            self.held[item.id] = item
        after: list[tuple[str, str, int, dict[str, Any]]] = []
        following: list[Leased] = []
        cancelled = False
        try:
            async with self.store.tasks.batch(conn) as batch:
                untouched: list[tuple[Leased, float]] = []
                for item in leased:
                    await self._run_one(batch, item, untouched, after)
                if untouched:
                    held = await batch.ack([item for item, _ in untouched])
                    for item, duration in untouched:
                        if item.id in held:
                            after.append(_succeeded(item, duration))
                        else:
                            after.append(_lost(item))
                if stopping is not None and not stopping.is_set():
                    following = await batch.lease(
                        self.queues, self.batch, self.token(), self.by, self.lease
                    )
        except asyncio.CancelledError:
            # Rolled back; the tasks stay in `held` so that consume() hands them back.
            cancelled = True
            raise
        except Exception as exc:
            events.emit(
                "task.batch_failed",
                "the batch's transaction failed and rolled back; its tasks are available again",
                level=logging.ERROR,
                ids=",".join(str(item.id) for item in leased),
                error=f"{type(exc).__name__}: {exc}",
            )
            with contextlib.suppress(Exception):
                await self.store.tasks.release(leased, started=True)
            return []
        finally:
            if not cancelled:
                for item in leased:
                    self.held.pop(item.id, None)
        for event, text, level, fields in after:
            events.emit(event, text, level=level, **fields)
        return following

    async def _run_one(
        self,
        batch: Batch,
        item: Leased,
        untouched: list[tuple[Leased, float]],
        after: list[tuple[str, str, int, dict[str, Any]]],
    ) -> None:
        task = self.app.tasks.find(item.task)
        policy = task.retry if task is not None else DEFAULT_POLICY
        if item.attempt > policy.attempts:
            # The previous attempt's worker died (its lease ran out) and it was the last.
            error = f"LeaseExpired: attempt {item.attempt - 1} of {policy.attempts} never finished"
            if await batch.outcome(item, TaskState.DEAD, None, error):
                after.append(_ended(item, "task.dead", "attempts exhausted", error))
            return
        events.emit(
            "task.started",
            "started",
            level=logging.DEBUG,
            task=item.task,
            id=item.id,
            attempt=item.attempt,
        )
        started = time.perf_counter()
        session = batch.session()
        try:
            if task is None:
                raise LookupError(f"no task {item.task!r} is registered in this worker's app")
            await _call(task, session, item.args)
            await session.flush()
            if batch.touched(session):
                if not await batch.ack_in(session, item):
                    raise LeaseLost()
                after.append(_succeeded(item, time.perf_counter() - started))
            else:
                untouched.append((item, time.perf_counter() - started))
        except Exception as exc:
            await batch.undo(session)
            if isinstance(exc, LeaseLost):
                after.append(_lost(item))
                return
            await self._failed(batch, item, policy, exc, time.perf_counter() - started, after)
        finally:
            hand_back(session.sync_session)
            await session.close()

    async def _failed(
        self,
        batch: Batch,
        item: Leased,
        policy: RetryPolicy,
        exc: BaseException,
        duration: float,
        after: list[tuple[str, str, int, dict[str, Any]]],
    ) -> None:
        decision = policy.decide(exc, item.attempt, clock.utcnow())
        text = _error_text(exc)
        fields: dict[str, Any] = {
            "task": item.task,
            "id": item.id,
            "attempt": item.attempt,
            "duration_ms": round(duration * 1000, 1),
            "error": f"{type(exc).__name__}: {exc}",
        }
        if isinstance(decision, Retry):
            if await batch.outcome(item, TaskState.AVAILABLE, decision.wait, text):
                after.append(
                    (
                        "task.retry",
                        "failed; rolled back, will retry",
                        logging.WARNING,
                        {**fields, "wait": round(decision.wait, 3)},
                    )
                )
            else:
                after.append(_lost(item))
        elif isinstance(decision, Discard):
            if await batch.outcome(item, TaskState.DISCARDED, None, text):
                after.append(
                    ("task.discarded", "failed with a discard_on error", logging.INFO, fields)
                )
            else:
                after.append(_lost(item))
        else:
            assert isinstance(decision, GiveUp)
            if await batch.outcome(item, TaskState.DEAD, None, text):
                after.append(
                    (
                        "task.dead",
                        f"failed; {decision.reason}; kept as dead",
                        logging.ERROR,
                        {**fields, "reason": decision.reason},
                    )
                )
            else:
                after.append(_lost(item))

    # -- leases -------------------------------------------------------------------------

    async def _heartbeat(self, stopping: asyncio.Event) -> None:
        interval = self.lease / 3
        while not stopping.is_set():
            await self.pause(stopping, interval)
            held = list(self.held.values())
            if not held:
                continue
            try:
                renewed = await self.store.tasks.heartbeat(held, self.lease)
            except OncelyError as exc:
                logger.debug("heartbeat failed: %s", exc)
                continue
            for item in held:
                if item.id not in renewed and item.id in self.held:
                    logger.debug("lease of task %s not renewed (busy or lost)", item.id)

    async def _rescuer(self, stopping: asyncio.Event) -> None:
        interval = max(0.05, min(self.lease / 2, 10.0))
        while not stopping.is_set():
            try:
                for row in await self.store.tasks.rescue():
                    events.emit(
                        "task.lease_expired",
                        "its worker stopped renewing the lease; available again",
                        level=logging.WARNING,
                        task=row.task,
                        id=row.id,
                        attempt=row.attempt,
                        locked_by=row.locked_by,
                    )
                    self.notify()
            except OncelyError as exc:
                logger.debug("rescue failed: %s", exc)
            await self.pause(stopping, interval)


async def _call(task: Task, session: AsyncSession, args: dict[str, Any]) -> None:
    if task.is_async:
        call = task.func(session, **args)
        if task.timeout is not None:
            await asyncio.wait_for(call, task.timeout)
        else:
            await call
    else:
        await session.run_sync(lambda sync_session: task.func(sync_session, **args))
    what = violation(session.sync_session)
    if what is not None:
        from .errors import JobTransactionError

        raise JobTransactionError(f"the task called {what}() on oncely's session")


def _succeeded(item: Leased, duration: float) -> tuple[str, str, int, dict[str, Any]]:
    return (
        "task.succeeded",
        "succeeded",
        logging.DEBUG,
        {
            "task": item.task,
            "id": item.id,
            "attempt": item.attempt,
            "duration_ms": round(duration * 1000, 1),
        },
    )


def _lost(item: Leased) -> tuple[str, str, int, dict[str, Any]]:
    return (
        "task.lease_lost",
        "another worker took this task over; this attempt rolled back",
        logging.WARNING,
        {"task": item.task, "id": item.id, "attempt": item.attempt},
    )


def _ended(item: Leased, event: str, text: str, error: str) -> tuple[str, str, int, dict[str, Any]]:
    return (
        event,
        text,
        logging.ERROR,
        {"task": item.task, "id": item.id, "attempt": item.attempt, "error": error},
    )


async def consume(
    app: Oncely,
    stopping: asyncio.Event,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    lease: float | None = None,
    queues: list[str] | None = None,
    batch: int = DEFAULT_BATCH,
    poll: float = DEFAULT_POLL,
) -> None:
    """Run `app`'s tasks until `stopping` is set and the batches in flight have committed.

    `concurrency` transactions run at once, each a batch of up to `batch` tasks; `lease`
    (default `app.lease`) is how long a silent worker keeps its tasks; `queues` limits which
    queues it serves (default all); `poll` is the fallback wake-up interval in seconds.
    Cancelling the call rolls back the batches in flight; their tasks run again later.
    """
    worker = Worker(
        app, concurrency=concurrency, lease=lease, queues=queues, batch=batch, poll=poll
    )
    await worker.consume(stopping)


# -- operations -------------------------------------------------------------------------


async def list_tasks(
    app: Oncely,
    state: TaskState | None = None,
    task: str | None = None,
    limit: int = 50,
) -> list[TaskRecord]:
    """Tasks newest first, optionally of one state and one task."""
    return await app.store.tasks.listing(state, task, limit)


async def retry_task(app: Oncely, task_id: int) -> TaskRecord:
    """Run a dead, discarded or waiting task again now, with a fresh set of attempts."""
    rec = await app.store.tasks.retry_now(task_id)
    if rec is None:
        raise _state_error(
            await app.store.tasks.get(task_id), task_id, "retried", "dead, discarded or available"
        )
    return rec


async def discard_task(app: Oncely, task_id: int) -> TaskRecord:
    """Discard a task that has not succeeded; a running attempt of it then rolls back."""
    rec = await app.store.tasks.discard(task_id)
    if rec is None:
        raise _state_error(
            await app.store.tasks.get(task_id), task_id, "discarded", "available, running or dead"
        )
    return rec


def _state_error(rec: TaskRecord | None, task_id: int, what: str, allowed: str) -> OncelyError:
    if rec is None:
        return BadInputError(f"no task with id {task_id}")
    return TaskStateError(
        f"task {task_id} ({rec.task}) is {rec.state.value}: only {allowed} tasks can be {what}"
    )


async def prune(app: Oncely, older_than: timedelta, now: datetime | None = None) -> tuple[int, int]:
    """Delete tasks finished, and slot claims made, more than `older_than` ago.

    A claim is what stops a slot from running twice: prune only claims older than the longest
    catch-up window plus retry horizon of any job, or an old slot could run again.
    """
    if older_than <= timedelta(0):
        raise BadInputError(f"--older-than must be positive, got {older_than}")
    return await app.store.tasks.prune((now or clock.utcnow()) - older_than)
