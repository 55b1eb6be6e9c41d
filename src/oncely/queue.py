"""The queue worker: fetch due tasks with a lease, run each with its ack, retry per policy.

`consume(app, stopping)` runs `concurrency` lanes. A lane leases a batch of due tasks (one
short transaction: the attempt counts even if the worker dies), then runs the batch in one
transaction (or a few: at most SAVEPOINTS tasks that write per transaction). A task that
raises has its work rolled back and its retry or end recorded in the same transaction. At its
end the transaction acks every task that returned with one compare-and-set on (id, lease
token), so each task's work and its ack commit together or not at all; if a task that wrote
lost its lease meanwhile, the transaction rolls back and runs again without it. Fast tasks
come in large batches, slow ones one at a time.

While tasks succeed, a transaction's tasks run without savepoints (one round trip less per
task that writes). When a task that wrote fails there, the transaction rolls back and runs
again with a savepoint for each task: the failure is recorded without running that task
again (its retry waits as its policy says), tasks that returned without writing are acked
without running again, and only the tasks that wrote before it run a second time. After a
failure the worker keeps savepoints for CAUTION transactions.
Leases are in database time; a heartbeat renews them while tasks run and a rescuer hands tasks
whose lease ran out (their worker died) to another worker. Postgres wakes idle lanes with
LISTEN/NOTIFY; polling is the fallback.
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
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from . import clock, events
from .errors import BadInputError, DatabaseUnavailableError, OncelyError, TaskStateError
from .identity import replica_id
from .model import TaskRecord, TaskState
from .retry import DEFAULT_POLICY, Discard, GiveUp, Retry, RetryPolicy
from .store.session import violation
from .store.task_store import Batch, Leased
from .tasks import Task, encode_result

if TYPE_CHECKING:
    from .app import Oncely

logger = logging.getLogger("oncely")

DEFAULT_LEASE = 30.0
"""Seconds a worker holds a task before another may take it over; heartbeats renew it."""
DEFAULT_CONCURRENCY = 10
DEFAULT_BATCH = 50
"""Tasks leased at once until the worker has timed a batch (then see `Worker.limit`)."""
MAX_BATCH = 500
"""The most tasks a worker leases at once, by default."""
BATCH_SECONDS = 1.0
"""About how long the tasks of one lease take to run, at most: fast tasks come in batches of
up to MAX_BATCH, tasks that take a second or more one at a time."""
SAVEPOINTS = 50
"""Tasks that write per transaction: under Postgres' 64 cached subtransactions (and the most
tasks an unguarded transaction's rollback makes run again)."""
CAUTION = 20
"""Transactions that give every task a savepoint after one in which a task failed."""
DEFAULT_POLL = 1.0


Event = tuple[str, str, int, dict[str, Any]]
"""A log event to emit once its batch has committed: (event, text, level, fields)."""


@dataclass
class _Done:
    """A task that returned: acked with the others at the end of its batch."""

    item: Leased
    duration: float
    wrote: bool
    result: str | None = None
    """The task's return value as stored JSON (tasks.encode_result); None: it returned None."""


@dataclass
class _Failed:
    """A task that raised: its retry or end is recorded in its batch's transaction."""

    duration: float
    error: Exception


Tried = dict[int, "_Done | _Failed"]
"""What the tasks of one transaction did, by task id."""


def _kept(tried: Tried) -> Tried:
    """What still holds after a transaction rolled back: failures (to record, not to run
    again) and tasks that returned without writing (to ack, not to run again)."""
    return {i: r for i, r in tried.items() if isinstance(r, _Failed) or not r.wrote}


class _LostWork(Exception):
    """Tasks that wrote lost their leases mid-batch: roll the batch back, run it without them."""

    def __init__(self, ids: set[int]) -> None:
        super().__init__(f"leases lost: {sorted(ids)}")
        self.ids = ids


class _Unguarded(Exception):
    """A task that wrote failed in a transaction without savepoints: roll the transaction back
    and run it again with them."""


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
                conn,
                worker.queues,
                worker.limit(),
                worker.token(),
                worker.by,
                worker.lease,
                worker.names,
            )
            if not leased:
                await worker.idle(stopping)
                continue
            while leased:
                if len(leased) >= worker.limit():
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
        batch: int = MAX_BATCH,
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
        self.names = sorted(task.name for task in app.tasks)
        """The task names this worker leases: the ones its app registered (a task of a name
        it does not know waits for a worker that knows it, e.g. during a rolling deploy)."""
        self.handed_back = 0
        """Tasks whose attempts the shutdown cancelled and handed back."""
        self._sleepers: collections.deque[asyncio.Event] = collections.deque()
        self._pending = False
        self.lanes = self.store.engine
        """Where lanes (and the listener) get their long-lived connections."""
        self.held: dict[int, Leased] = {}
        """Leased tasks not yet finished: what the heartbeat renews."""
        self._pace: float | None = None
        """Seconds a task takes to run here (a moving average); None before the first."""
        self._prefix = uuid.uuid4().hex[:16]
        self._counter = itertools.count()
        self._caution = 0
        """Transactions left that give each task a savepoint (after one where a task failed)."""

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
        """Hand back the tasks of cancelled batches (their work rolled back): available at
        once, the attempt not counted, recorded as cancelled by the shutdown."""
        if not self.held:
            return
        leftover = list(self.held.values())
        self.held.clear()
        try:
            handed = await asyncio.shield(self.store.tasks.hand_back(leftover))
        except Exception as exc:  # their leases run out instead; the rescuer hands them on
            events.emit(
                "worker.error",
                "could not hand back the cancelled tasks; they wait for their lease to run out",
                level=logging.ERROR,
                error=str(exc),
            )
            return
        self.handed_back += len(handed)
        for row in handed:
            events.emit(
                "task.cancelled",
                "cancelled by the shutdown; rolled back and handed back (attempt not counted)",
                level=logging.WARNING,
                task=row.task,
                id=row.id,
                attempt=row.attempt + 1,
            )

    async def run_batch(
        self, conn: AsyncConnection, leased: list[Leased], stopping: asyncio.Event | None = None
    ) -> list[Leased]:
        """Run leased tasks in as few transactions as can hold them, the tasks of a
        transaction acked together at its end.

        A transaction ends after `SAVEPOINTS` tasks that wrote, or with the last task; unless
        `stopping` is set, the last one also leases the next batch, which this returns (empty
        if it failed: those leases rolled back with it). If a task that wrote turns out to
        have lost its lease, its transaction rolls back (its work with the others') and runs
        again without it. If a task that wrote fails without a savepoint, the transaction
        rolls back and runs again with savepoints (see the module's docstring).
        """
        for item in leased:
            self.held[item.id] = item
        following: list[Leased] = []
        cancelled = False
        todo = leased
        kept: Tried = {}
        rerun = False
        try:
            while todo:
                tried: Tried = dict(kept)
                guarded = rerun or self._caution > 0
                try:
                    after, following, rest, spent = await self._transaction(
                        conn, todo, stopping, tried, guarded
                    )
                except _LostWork as lost:
                    for item in todo:
                        if item.id in lost.ids:
                            _emit(_lost(item))
                    todo = [item for item in todo if item.id not in lost.ids]
                    kept = _kept(tried)
                    continue
                except _Unguarded:
                    kept, rerun = _kept(tried), True
                    _emit(_rerun(tried))
                    continue
                self._mind(tried)
                for item in todo[: len(todo) - len(rest)]:
                    self.held.pop(item.id, None)
                for event in after:
                    _emit(event)
                self._learn(len(todo) - len(rest), spent)
                # What a rolled-back run left for tasks not reached yet (normally nothing).
                kept = {item.id: kept[item.id] for item in rest if item.id in kept}
                todo, rerun = rest, False
        except asyncio.CancelledError:
            # Rolled back; the tasks stay in `held` so that consume() hands them back.
            cancelled = True
            raise
        except Exception as exc:
            _emit(
                (
                    "task.batch_failed",
                    "the batch's transaction failed and rolled back; its tasks are available again",
                    logging.ERROR,
                    {
                        "ids": ",".join(str(item.id) for item in todo),
                        "error": f"{type(exc).__name__}: {exc}",
                    },
                )
            )
            with contextlib.suppress(Exception):
                await self.store.tasks.release(todo, started=True)
            return []
        finally:
            if not cancelled:
                for item in leased:
                    self.held.pop(item.id, None)
        return following

    async def _transaction(
        self,
        conn: AsyncConnection,
        todo: list[Leased],
        stopping: asyncio.Event | None,
        tried: Tried,
        guarded: bool,
    ) -> tuple[list[Event], list[Leased], list[Leased], float]:
        """Run tasks of `todo` in one transaction: (its events, the next batch, the tasks left,
        the seconds its tasks took). `tried` holds what a rolled-back run of these tasks
        left to reuse, and gets what each task does now."""
        after: list[Event] = []
        following: list[Leased] = []
        rest: list[Leased] = []
        spent = 0.0
        async with self.store.tasks.batch(conn, guarded=guarded) as batch:
            done: list[_Done] = []
            lost: set[int] = set()
            for i, item in enumerate(todo):
                spent += await self._run_one(batch, item, tried, done, lost, after)
                if batch.writers >= SAVEPOINTS:
                    rest = todo[i + 1 :]
                    break
            if done:
                results = {d.item.id: d.result for d in done if d.result is not None}
                held = await batch.ack([d.item for d in done], results)
                lost.update(d.item.id for d in done if d.item.id not in held)
                if any(d.wrote and d.item.id in lost for d in done):
                    raise _LostWork(lost)  # rolls back: a lost task's work must not land
                for d in done:
                    after.append(_lost(d.item) if d.item.id in lost else _succeeded(d))
            if not rest and stopping is not None and not stopping.is_set():
                following = await batch.lease(
                    self.queues, self.limit(), self.token(), self.by, self.lease, self.names
                )
        return after, following, rest, spent

    def _mind(self, tried: Tried) -> None:
        """After a committed transaction: savepoints for the next CAUTION transactions if one
        of its tasks failed, else one transaction less of them."""
        if any(isinstance(r, _Failed) for r in tried.values()):
            self._caution = CAUTION
        else:
            self._caution = max(0, self._caution - 1)

    def limit(self) -> int:
        """How many tasks to lease at once: about `BATCH_SECONDS` of work at the pace of the
        last tasks, at most `batch` (at first, at most `DEFAULT_BATCH`).

        Fast tasks come in large batches (fewer statements and commits per task); slow ones
        one by one, so that a lane never hoards tasks that idle lanes could be running.
        """
        if self._pace is None:
            return min(self.batch, DEFAULT_BATCH)
        return max(1, min(self.batch, int(BATCH_SECONDS / max(self._pace, 1e-6))))

    def _learn(self, tasks: int, seconds: float) -> None:
        if not tasks:
            return
        pace = seconds / tasks
        self._pace = pace if self._pace is None else 0.7 * self._pace + 0.3 * pace

    async def _run_one(
        self,
        batch: Batch,
        item: Leased,
        tried: Tried,
        done: list[_Done],
        lost: set[int],
        after: list[Event],
    ) -> float:
        """Run one task (or reuse what a rolled-back run of it did); the seconds it took."""
        task = self.app.tasks.find(item.task)
        policy = task.retry if task is not None else DEFAULT_POLICY
        earlier = tried.get(item.id)
        if isinstance(earlier, _Done):  # returned without writing: nothing of it rolled back
            done.append(earlier)
            return earlier.duration
        if isinstance(earlier, _Failed):  # recorded now; running it again would skip its wait
            if not await self._failed(batch, item, policy, earlier.error, earlier.duration, after):
                lost.add(item.id)
            return earlier.duration
        if item.attempt > policy.attempts:
            # The previous attempt's worker died (its lease ran out) and it was the last.
            error = f"LeaseExpired: attempt {item.attempt - 1} of {policy.attempts} never finished"
            if await batch.outcome(item, TaskState.DEAD, None, error):
                after.append(_ended(item, "task.dead", "attempts exhausted", error))
            else:
                lost.add(item.id)
                after.append(_lost(item))
            return 0.0
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
            value = await _call(task, session, item.args)
            result = encode_result(value, task.name, task.limits.max_result)
            await batch.finish(session)
            duration = time.perf_counter() - started
            done.append(_Done(item, duration, batch.touched(session), result))
            tried[item.id] = done[-1]
        except Exception as exc:
            duration = time.perf_counter() - started
            tried[item.id] = _Failed(duration, exc)
            if not await batch.undo(session):
                raise _Unguarded() from exc
            if not await self._failed(batch, item, policy, exc, duration, after):
                lost.add(item.id)
        finally:
            await batch.close(session)
        return duration

    async def _failed(
        self,
        batch: Batch,
        item: Leased,
        policy: RetryPolicy,
        exc: BaseException,
        duration: float,
        after: list[Event],
    ) -> bool:
        """Record a failed attempt's retry or end per the policy; False if the lease was lost."""
        decision = policy.decide(exc, item.attempt, clock.utcnow())
        text = _error_text(exc)
        fields: dict[str, Any] = {
            "task": item.task,
            "id": item.id,
            "attempt": item.attempt,
            "duration_ms": round(duration * 1000, 1),
            "error": f"{type(exc).__name__}: {exc}",
        }
        event: Event
        if isinstance(decision, Retry):
            state, wait = TaskState.AVAILABLE, decision.wait
            event = (
                "task.retry",
                "failed; rolled back, will retry",
                logging.WARNING,
                {**fields, "wait": round(decision.wait, 3)},
            )
        elif isinstance(decision, Discard):
            state, wait = TaskState.DISCARDED, None
            event = (
                "task.discarded",
                "failed with a discard_on error",
                logging.INFO,
                fields,
            )
        else:
            assert isinstance(decision, GiveUp)
            state, wait = TaskState.DEAD, None
            event = (
                "task.dead",
                f"failed; {decision.reason}; kept as dead",
                logging.ERROR,
                {**fields, "reason": decision.reason},
            )
        if not await batch.outcome(item, state, wait, text):
            after.append(_lost(item))
            return False
        after.append(event)
        return True

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


async def _call(task: Task, session: AsyncSession, args: dict[str, Any]) -> Any:
    if task.is_async:
        call = task.func(session, **args)
        if task.timeout is not None:
            value = await asyncio.wait_for(call, task.timeout)
        else:
            value = await call
    else:
        value = await session.run_sync(lambda sync_session: task.func(sync_session, **args))
    what = violation(session.sync_session)
    if what is not None:
        from .errors import JobTransactionError

        raise JobTransactionError(f"the task called {what}() on oncely's session")
    return value


def _succeeded(done: _Done) -> Event:
    item = done.item
    return (
        "task.succeeded",
        "succeeded",
        logging.DEBUG,
        {
            "task": item.task,
            "id": item.id,
            "attempt": item.attempt,
            "duration_ms": round(done.duration * 1000, 1),
        },
    )


def _emit(event: Event) -> None:
    name, text, level, fields = event
    events.emit(name, text, level=level, **fields)


def _rerun(tried: Tried) -> Event:
    again = [i for i, r in tried.items() if isinstance(r, _Done) and r.wrote]
    failed = [i for i, r in tried.items() if isinstance(r, _Failed)]
    return (
        "task.batch_rerun",
        "a task that wrote failed without a savepoint; its transaction rolled back and runs "
        "again with savepoints",
        logging.INFO,
        {"failed": ",".join(map(str, failed)), "again": ",".join(map(str, again))},
    )


def _lost(item: Leased) -> Event:
    return (
        "task.lease_lost",
        "another worker took this task over; this attempt rolled back",
        logging.WARNING,
        {"task": item.task, "id": item.id, "attempt": item.attempt},
    )


def _ended(item: Leased, event: str, text: str, error: str) -> Event:
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
    batch: int = MAX_BATCH,
    poll: float = DEFAULT_POLL,
) -> None:
    """Run `app`'s tasks until `stopping` is set and the batches in flight have committed.

    `concurrency` lanes run at once, each leasing up to `batch` tasks at a time; `lease`
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
    return await app.store.tasks.prune((now or await app.store.database_time()) - older_than)
