"""The loop of schedules kept as data: look up the due ones, run their slots, move them on.

Every `schedule_poll` seconds (default 1) a worker reads the active schedules whose next
slot is due, from the partial index on `next_slot` (a range of it, never the whole table),
and runs each one's slots through the runner, as a code job's: the claim in oncely_runs
under `schedule:<name>` decides who runs a slot, so every replica may look at the same row.
A slot's attempt moves the row's `next_slot` on in its own transaction, right after its claim
(see `schedules.advancing`), so a committed slot leaves the due list with its claim, and an
attempt that finds the row moved or gone since it was read (changed, removed) does not start;
an attempt that did not commit (failed, given up, paused, a duplicate) is moved on after it,
by a compare-and-set on the value read, so a change made meanwhile wins. A slot found busy (a
replica runs it right now) or waiting for its retry is left due: it is looked at again.

On Postgres the due rows are read with FOR UPDATE SKIP LOCKED and leased to the reader for
LEASE seconds (renewed while their slots run, ended when they are done), so one worker at a
time attempts a due row: replicas do not spend attempts on a slot another is running. SQLite
keeps its single writer's read. The claim, not the lease, still decides who runs a slot.

Rows are read afresh at every look: a schedule added, changed, paused or removed takes effect
on every replica within one poll, without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from .. import clock, events
from ..errors import OncelyError, ScheduleError
from ..identity import replica_id
from ..model import RunStatus, ScheduleRecord
from ..registry import Job, Registry
from ..runner import run_slot
from ..scheduler import data_slots
from ..schedules import advancing, job_for
from ..store import Store
from ..tasks import TaskRegistry
from .options import WorkerOptions
from .outage import Outage

BATCH = 200
"""Due schedules read in one look; more are read at the next one, without waiting."""
IN_FLIGHT = 8
"""Schedules whose slots one worker runs at once (each attempt holds a connection)."""
LEASE = 10.0
"""Seconds a due row read by this worker is its own (Postgres): renewed at every look while
its slots run, ended when they are done; a worker that dies leaves its rows to the others
after at most this."""
HOLD_BUSY = 1.0
"""Seconds a schedule whose slot was busy (a replica runs it) is left alone by this worker."""
OUTAGE_BACKOFF_MAX = 5.0
PART = "schedules"
"""This loop, among the parts of a worker that meet an outage."""
CLOCK_CHECK_EVERY = 60.0
_SETTLED = (
    RunStatus.RAN,
    RunStatus.SKIPPED,
    RunStatus.FAILED,
    RunStatus.TIMEOUT,
    RunStatus.CANCELLED,
    RunStatus.PAUSED,
    RunStatus.GIVEN_UP,
)
"""Outcomes after which the slot is decided: the schedule moves on to its next slot."""


@dataclass
class _Hold:
    until: float
    """Monotonic time before which this worker does not look at the schedule again."""


class ScheduleWorker:
    """Runs the due slots of the schedules kept as data until `stopping` is set."""

    def __init__(
        self,
        store: Store,
        jobs: Registry,
        tasks: TaskRegistry,
        stopping: asyncio.Event,
        options: WorkerOptions,
        *,
        replica: str | None = None,
        outage: Outage | None = None,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.tasks = tasks
        self.stopping = stopping
        self.poll = options.schedule_poll
        self.shutdown_timeout = options.shutdown_timeout
        self.replica = replica or replica_id()
        self._offset = timedelta(0)
        self._offset_read_at: float | None = None
        self._running: dict[str, asyncio.Task[None]] = {}
        self._held: dict[str, _Hold] = {}
        self._built: dict[tuple[str, int], Job] = {}
        self._unavailable = False
        """Whether the last look failed (the next one waits longer)."""
        self.outage = outage or Outage(self.replica)
        """The process's database outage, which this loop reports to as the part "schedules"."""
        self._rng = random.Random()
        self._slots = asyncio.Semaphore(IN_FLIGHT)
        self.looks = 0
        """How many times this worker read the due schedules (its idle cost)."""

    def now(self) -> datetime:
        """This host's clock, corrected to the database's."""
        return clock.utcnow() + self._offset

    async def run(self) -> None:
        """Look at the due schedules every `poll` seconds until stopped; then let running
        attempts finish within the shutdown timeout (cancelled after it: rolled back)."""
        try:
            while not self.stopping.is_set():
                full = await self._look()
                if not full and await self._wait_stop(self._pause()):
                    break
                if full:
                    await asyncio.sleep(0)
        finally:
            await self._shutdown()

    def _pause(self) -> float:
        if self._unavailable:
            return min(OUTAGE_BACKOFF_MAX, self.poll * 4) * self._rng.uniform(0.5, 1.5)
        return self.poll * self._rng.uniform(0.9, 1.1)  # replicas drift apart, not in step

    async def _wait_stop(self, seconds: float) -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return self.stopping.is_set()

    async def _look(self) -> bool:
        """One look at the due schedules; whether the batch was full (look again at once)."""
        try:
            await self.store.ensure_schema()
            if not self.store.has_schedules:
                return False
            await self._read_clock()
            now = self.now()
            until = now + timedelta(seconds=LEASE)
            await self.store.schedules.renew(list(self._running), self.replica, until)
            due = await self.store.schedules.take_due(now, BATCH, self.replica, until)
            self.looks += 1
        except OncelyError as exc:
            self._outage(exc)
            return False
        self._back()
        self._rng.shuffle(due)  # replicas that read the same rows start on different ones
        started, left = 0, []
        for record in due:
            if self._startable(record):
                self._start(record, now)
                started += 1
            elif record.name not in self._running:  # still ours while its slots run
                left.append(record.name)
        with contextlib.suppress(OncelyError):
            await self.store.schedules.release(left, self.replica)
        return len(due) >= BATCH and started > 0

    async def _read_clock(self) -> None:
        if self._offset_read_at is not None and (
            time.monotonic() - self._offset_read_at < CLOCK_CHECK_EVERY
        ):
            return
        before = clock.utcnow()
        started = time.monotonic()
        db_now = await self.store.database_time()
        elapsed = time.monotonic() - started
        self._offset = db_now - (before + timedelta(seconds=elapsed / 2))
        self._offset_read_at = time.monotonic()

    def _startable(self, record: ScheduleRecord) -> bool:
        if record.name in self._running:
            return False
        hold = self._held.get(record.name)
        if hold is not None:
            if hold.until > time.monotonic():
                return False
            del self._held[record.name]
        return True

    def _start(self, record: ScheduleRecord, now: datetime) -> None:
        task = asyncio.create_task(self._handle(record, now), name=f"oncely:{record.ledger_name}")
        self._running[record.name] = task
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        for name, running in list(self._running.items()):
            if running is task:
                del self._running[name]

    def _job(self, record: ScheduleRecord) -> Job:
        key = (record.name, record.version)
        job = self._built.get(key)
        if job is None:
            job = job_for(record, self.jobs, self.tasks)
            self._built = {k: v for k, v in self._built.items() if k[0] != record.name}
            self._built[key] = job
        return job

    async def _handle(self, record: ScheduleRecord, now: datetime) -> None:
        """Decide and run the due slots of one schedule, move its next slot on, and end its
        lease."""
        try:
            await self._run_due(record, now)
        finally:
            with contextlib.suppress(OncelyError):
                await self.store.schedules.release([record.name], self.replica)

    async def _run_due(self, record: ScheduleRecord, now: datetime) -> None:
        assert record.next_slot is not None
        try:
            job = self._job(record)
        except ScheduleError as exc:
            self._not_runnable(record, exc)
            return
        # Replicas read the same due rows: one that another has moved on meanwhile is left
        # (a lookup by name, instead of an attempt that finds its slot claimed).
        try:
            if not await self.store.schedules.still_due(record.name, record.next_slot):
                return
        except OncelyError as exc:
            self._outage(exc)
            return
        slots, missed = data_slots(job, record.next_slot, now)
        if missed is not None:
            events.emit(
                "run.missed",
                "slots came due but will not run",
                level=logging.WARNING,
                job=job.name,
                count=missed.count,
                first=missed.first.isoformat(),
                last=missed.last.isoformat(),
                reason=missed.reason,
                catch_up=job.catch_up,
                replica=self.replica,
            )
            with contextlib.suppress(OncelyError):
                await self.store.control.note(
                    job.name,
                    None,
                    missed.first,
                    "missed",
                    self.replica,
                    slot_last=missed.last,
                    reason=missed.reason,
                )
        expected: datetime | None = record.next_slot
        for slot in slots:
            following = job.schedule.next_after(slot)
            status, retry_at = await self._attempt(job, record.name, expected, slot, following)
            if retry_at is not None:  # its retry policy runs it again then: left due, held
                wait = max(0.0, (retry_at - self.now()).total_seconds())
                self._held[record.name] = _Hold(time.monotonic() + wait)
                return
            if status not in _SETTLED:
                if status is RunStatus.BUSY:
                    self._held[record.name] = _Hold(time.monotonic() + HOLD_BUSY)
                return  # left due: looked at again (busy, retry wait, outage, unknown)
            if status is not RunStatus.RAN and not await self._advance(record, expected, following):
                return  # changed meanwhile: the change decides what is next
            expected = following  # a slot that ran moved it on in its own transaction
        if not slots:  # only missed slots (or none left of a stale next slot): move past them
            after = missed.last if missed is not None else now
            await self._advance(record, expected, job.schedule.next_after(after))

    async def _advance(
        self, record: ScheduleRecord, expected: datetime | None, following: datetime | None
    ) -> bool:
        if expected is None:
            return False
        try:
            return await self.store.schedules.advance(record.name, expected, following)
        except OncelyError as exc:
            self._outage(exc)
            return False

    async def _attempt(
        self,
        job: Job,
        name: str,
        expected: datetime | None,
        slot: datetime,
        following: datetime | None,
    ) -> tuple[RunStatus | None, datetime | None]:
        """One attempt at a slot: its outcome (None: the database failed) and, for a failure
        its retry policy retries, when."""
        latency_ms = round((self.now() - slot).total_seconds() * 1000, 1)
        async with self._slots:
            try:
                with events.routine():
                    result = await run_slot(
                        self.store,
                        job,
                        slot,
                        job.key_for(slot),
                        self.replica,
                        context={"latency_ms": latency_ms},
                        check_pause=True,
                        guard=None if expected is None else advancing(name, expected, following),
                    )
            except OncelyError as exc:
                self._outage(exc)
                return None, None
        error = result.error
        if (
            result.status is RunStatus.FAILED
            and error is not None
            and self.store.is_unavailable(error)
        ):
            self._outage(error)
            return None, None
        return result.status, result.retry_at

    def _not_runnable(self, record: ScheduleRecord, exc: ScheduleError) -> None:
        """A schedule whose target this release does not register: left due, for a replica
        of a release that does; said once a minute."""
        self._held[record.name] = _Hold(time.monotonic() + 60.0)
        events.emit(
            "schedule.unrunnable",
            "a schedule's target is not registered in this worker: left to others",
            level=logging.WARNING,
            job=record.ledger_name,
            error=str(exc),
            replica=self.replica,
        )

    def _outage(self, exc: BaseException) -> None:
        """A statement failed: an outage (said once per process), or another error (said
        once until a look succeeds); the loop looks again after a longer pause."""
        if self.store.is_unavailable(exc):
            self.outage.failed(PART, exc)
        elif not self._unavailable:
            events.emit(
                "worker.error",
                "reading the due schedules failed; retrying",
                level=logging.ERROR,
                replica=self.replica,
                error=str(exc),
            )
        self._unavailable = True

    def _back(self) -> None:
        self._unavailable = False
        self.outage.answered(PART)

    async def _shutdown(self) -> None:
        running = set(self._running.values())
        if not running:
            return
        _done, pending = await asyncio.wait(running, timeout=self.shutdown_timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=self.shutdown_timeout)
