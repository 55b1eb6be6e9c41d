"""The scheduled-job loop: sleep until the earliest slot is due, run it through the runner, repeat.

Every replica can run it: there is no leader, the slot claim decides who runs each slot. The
decisions (what is due, catch-up, overlap, busy retries) are scheduler.py's; this module does
the I/O around them: the clock, the ledger, attempts as asyncio tasks, database outages
(capped, jittered backoff, never dying) and a graceful shutdown (stop taking slots, let the
running attempts finish within `shutdown_timeout`, then cancel them: they roll back).
The supervisor (`oncely.work.supervisor`) runs it beside the task worker under one stop event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from .. import clock, events, tracing
from ..errors import ConfigError, DatabaseUnavailableError, OncelyError
from ..identity import replica_id
from ..model import RunStatus
from ..registry import Job
from ..runner import run_slot
from ..scheduler import Missed, OverlapSkipped, Paused, Run, Scheduler
from ..store import Store
from .options import WorkerOptions
from .outage import Outage

MAX_SLEEP = 30.0
"""The longest the loop sleeps without looking at the clock again (guards against clock jumps)."""
NOTE_TRIES = 6
"""How many times a worker tries to write the note of a slot it did not start (an overlap, a
missed range, a pause) before it gives up and says so (`run.note_failed`): on SQLite the write
waits for the one write lock, and a busy database refuses it past its busy timeout."""
NOTE_BACKOFF_FIRST = 0.1
"""The pause after a note's first failed try, doubling after each."""
RETRY_SCAN = 10.0
"""Seconds between two reads of the slots of this worker's jobs that wait for their retry
policy (scheduled by another worker, an `oncely run`, a backfill, or this worker before a
restart): a retry outlives the process that scheduled it."""
RETRY_LOOKBACK = timedelta(days=1)
"""How far back (by slot time) those reads look."""
CLOCK_CHECK_EVERY = 60.0
"""Seconds between two readings of the database's clock (slots come due by it)."""
CLOCK_REPORT_DRIFT = timedelta(milliseconds=500)
CLOCK_WARN_OFFSET = timedelta(seconds=2)

Clock = Callable[[], datetime]
PART = "jobs"
"""This loop, among the parts of a worker that meet an outage."""


class JobWorker:
    """Runs the due slots of `jobs` from a store until `stopping` is set (`options` gives
    its `shutdown_timeout` and `startup_wait`; `now` is this host's clock)."""

    def __init__(
        self,
        store: Store,
        jobs: Iterable[Job],
        stopping: asyncio.Event,
        options: WorkerOptions,
        *,
        now: Clock = clock.utcnow,
        replica: str | None = None,
        outage: Outage | None = None,
    ) -> None:
        self.store = store
        self.stopping = stopping
        self.jobs = list(jobs)
        self.shutdown_timeout = options.shutdown_timeout
        self.startup_wait = options.startup_wait
        self._local_now = now
        self._offset = timedelta(0)
        self._offset_read_at: float | None = None
        self.replica = replica or replica_id()
        self.scheduler = Scheduler(self.jobs, now())
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._notes: set[asyncio.Task[None]] = set()
        """Records of slots not started (overlap, missed), written beside the loop."""
        self.outage = outage or Outage(self.replica)
        """The process's database outage, which this loop reports to as the part "jobs"."""
        self._retries_read_at: float | None = None
        self.waited_for = 0
        """Attempts running when the worker was asked to stop."""
        self.cancelled = 0
        """Of those, attempts cancelled after `shutdown_timeout` (rolled back)."""

    def now(self) -> datetime:
        """The time slots come due by: this host's clock, corrected to the database's."""
        return self._local_now() + self._offset

    async def _read_clock(self) -> None:
        """Measure how far this host's clock is from the database's (Postgres; 0 on SQLite).

        A replica whose clock is ahead would otherwise run slots early, one behind late. The
        database's time is taken as read at the end of the round trip (whose first part may
        be a connect), so the corrected clock is never ahead of the database's: a slot is
        never claimed before its time, at worst one round trip after it.
        """
        await self.store.database_time()  # the connection is open: the next read is one trip
        before = self._local_now()
        started = time.monotonic()
        db_now = await self.store.database_time()
        elapsed = time.monotonic() - started
        offset = db_now - (before + timedelta(seconds=elapsed))
        self._offset_read_at = time.monotonic()
        if abs(offset - self._offset) > CLOCK_REPORT_DRIFT:
            events.emit(
                "worker.clock_offset",
                "this host's clock differs from the database's; using the database's",
                level=logging.WARNING if abs(offset) > CLOCK_WARN_OFFSET else logging.INFO,
                replica=self.replica,
                offset_ms=round(offset.total_seconds() * 1000, 1),
            )
        self._offset = offset

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until `stopping` is set, then shut down gracefully."""
        if not await self._connect():
            return
        tracing.warm()  # before the first slot: not inside its attempt
        self.scheduler.started = self.now()
        with contextlib.suppress(OncelyError):  # best effort: verify then dates by claims
            await self.store.control.seen_jobs([job.name for job in self.jobs])
        events.emit(
            "worker.started",
            "worker started",
            replica=self.replica,
            jobs=len(self.jobs),
            started=self.scheduler.started.isoformat(),
        )
        try:
            while not self.stopping.is_set():
                await self._tick()
                await self._sleep()
        finally:
            await self._shutdown()

    async def _connect(self) -> bool:
        """Check the schema and read the database's clock, waiting up to `startup_wait` for an
        unreachable database (it may be restarting); False if stopped meanwhile."""
        deadline = time.monotonic() + self.startup_wait
        while True:
            try:
                await self.store.ensure_schema(writes=True)
                await self._read_clock()
            except DatabaseUnavailableError as exc:
                if time.monotonic() >= deadline:
                    raise
                self._unavailable(exc)
                if await self._wait_stop(self._backoff()):
                    return False
                continue
            self._available()
            return True

    def _backoff(self) -> float:
        """The next wait while the database is unreachable: capped, doubling, jittered."""
        return self.outage.backoff(PART)

    async def _wait_stop(self, seconds: float) -> bool:
        """Wait up to `seconds` for the stop event; whether it is set."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return self.stopping.is_set()

    async def _tick(self) -> None:
        if (
            self._offset_read_at is None
            or self.outage.failing(PART)  # the probe: is the database back?
            or time.monotonic() - self._offset_read_at > CLOCK_CHECK_EVERY
        ):
            try:
                await self._read_clock()
            except OncelyError as exc:
                self._unavailable(exc)
                return
            self._available()
        now = self.now()
        unsynced = self.scheduler.unsynced(now)
        if unsynced:
            try:
                last = await self.store.claims.last_slots()
            except OncelyError as exc:  # unreachable, or a statement failed: back off, retry
                self._unavailable(exc)
                return
            self._available()
            for name in unsynced:
                self.scheduler.sync(name, last.get(name))
            now = self.now()
        if not await self._read_records(now):
            return
        for action in self.scheduler.due(now):
            if isinstance(action, Run):
                self._start(action)
            elif isinstance(action, Paused):
                with events.routine():  # every replica reports it: DEBUG, like a skip
                    _emit_paused(action, self.replica)
                key = action.job.key_for(action.last)
                self._note(action.job, key, action.first, "paused", action.last)
            elif isinstance(action, Missed):
                _emit_missed(action, self.replica)
                self._note(action.job, None, action.first, "missed", action.last, action.reason)
            elif isinstance(action, OverlapSkipped):
                _emit_overlap(action, self.replica)
                key = action.job.key_for(action.slot)
                self._note(action.job, key, action.slot, "overlap")

    async def _read_records(self, now: datetime) -> bool:
        """What the scheduler needs from the database before it decides at `now`: the
        retries others scheduled, the pauses; False if they could not be read."""
        if not await self._read_retries(now):
            return False
        return not self.scheduler.wants_pauses(now) or await self._read_pauses()

    async def _read_retries(self, now: datetime) -> bool:
        """Every RETRY_SCAN seconds, hand the scheduler the slots of this worker's jobs that
        wait for their retry policy; False if they could not be read (an outage)."""
        read_at = self._retries_read_at
        if read_at is not None and time.monotonic() - read_at < RETRY_SCAN:
            return True
        names = [job.name for job in self.jobs]
        try:
            found = await self.store.control.pending_retries(names, now - RETRY_LOOKBACK)
        except OncelyError as exc:
            self._unavailable(exc)
            return False
        self._retries_read_at = time.monotonic()
        self.scheduler.adopt_retries(found)
        return True

    async def _read_pauses(self) -> bool:
        """Hand the scheduler the pauses that may cover a slot it is about to decide (read
        once per step in which slots come due); False if they could not be read (the step
        is retried after the outage's backoff: nothing is decided without them)."""
        try:
            found = await self.store.control.pauses_since(self.scheduler.pause_floor())
        except OncelyError as exc:
            self._unavailable(exc)
            return False
        self.scheduler.set_pauses(found)
        return True

    def _note(
        self,
        job: Job,
        key: str | None,
        slot: datetime,
        outcome: str,
        last: datetime | None = None,
        reason: str | None = None,
    ) -> None:
        """Record a slot not started, beside the loop (on SQLite the write may wait for the
        running attempt's write lock). A write the database refuses is tried again, up to
        NOTE_TRIES times or until the worker stops; then `run.note_failed` says the slot's
        fate went unrecorded (`oncely verify` will call it unaccounted)."""

        async def write() -> None:
            pause = NOTE_BACKOFF_FIRST
            for tried in range(1, NOTE_TRIES + 1):
                try:
                    await self.store.control.note(
                        job.name, key, slot, outcome, self.replica, slot_last=last, reason=reason
                    )
                    return
                except OncelyError as exc:
                    error = exc
                if tried == NOTE_TRIES or self.stopping.is_set():
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), pause)
                pause *= 2
            events.emit(
                "run.note_failed",
                "a slot not started could not be recorded; verify will call it unaccounted",
                level=logging.WARNING,
                job=job.name,
                key=key,
                slot=(last or slot).isoformat(),
                outcome=outcome,
                tries=tried,
                error=f"{type(error).__name__}: {error}",
                replica=self.replica,
            )

        task = asyncio.create_task(write())
        self._notes.add(task)
        task.add_done_callback(self._notes.discard)

    async def _sleep(self) -> None:
        delay = MAX_SLEEP
        wake = self.scheduler.next_wake()
        if wake is not None:
            delay = min(delay, max(0.0, (wake - self.now()).total_seconds()))
        if self.outage.failing(PART):
            delay = max(delay, self._backoff())
        if delay <= 0:
            await asyncio.sleep(0)  # let finished attempts report before the next tick
            return
        self._wake.clear()
        stop = asyncio.ensure_future(self.stopping.wait())
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({stop, woken}, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            woken.cancel()

    # -- attempts -------------------------------------------------------------------------

    def _start(self, run: Run) -> None:
        task = asyncio.create_task(self._attempt(run), name=f"oncely:{run.job.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _attempt(self, run: Run) -> None:
        job = run.job
        try:
            for index, slot in enumerate(run.slots):
                if self.stopping.is_set():
                    self.scheduler.abandon(job, run.slots[index:])
                    return
                status, retry_at = await self._attempt_one(job, slot)
                self.scheduler.finished(job, slot, status, self.now(), retry_at)
                if status is None and self.outage.failing(PART):
                    for rest in run.slots[index + 1 :]:
                        self.scheduler.finished(job, rest, None, self.now())
                    return
        except asyncio.CancelledError:
            self.scheduler.abandon(job, run.slots)
            raise
        finally:
            self._wake.set()

    async def _attempt_one(
        self, job: Job, slot: datetime
    ) -> tuple[RunStatus | None, datetime | None]:
        """One attempt; the outcome, or None if the database failed (retried later), and
        when the job's retry policy runs the slot again."""
        latency_ms = round((self.now() - slot).total_seconds() * 1000, 1)
        key = ""
        retry = True  # what failed is the attempt's machinery: the slot stays free, retried
        try:
            retry = False  # a key function that raises is the job's own bug: given up
            key = job.key_for(slot)
            retry = True
            with events.routine():  # another replica winning the slot is routine: DEBUG
                result = await run_slot(
                    self.store,
                    job,
                    slot,
                    key,
                    self.replica,
                    context={"latency_ms": latency_ms},
                    check_pause=True,
                )
        except Exception as exc:
            if self.store.is_unavailable(exc):  # the server is down, restarting, starting up
                self._unavailable(exc)
                return None, None
            # A driver's error that escaped the store (a connection whose protocol state a
            # stall or a restart left behind) is not the slot's fate: another try, here or in
            # another replica, decides it. A ConfigError or a failing key function is.
            retry = retry and not isinstance(exc, ConfigError)
            events.emit(
                "worker.attempt_error",
                "the attempt failed before the job ran; "
                + ("it will be retried" if retry else "the slot is given up"),
                level=logging.WARNING if retry else logging.ERROR,
                job=job.name,
                key=key or None,
                slot=slot.isoformat(),
                replica=self.replica,
                error=f"{type(exc).__name__}: {exc}",
            )
            return (None if retry else RunStatus.FAILED), None
        error = result.error
        if result.status is RunStatus.FAILED and error and self.store.is_unavailable(error):
            self._unavailable(error)
            return None, None
        self._available()
        return result.status, result.retry_at

    # -- database outages -----------------------------------------------------------------

    def _unavailable(self, exc: BaseException) -> None:
        self.outage.failed(PART, exc)

    def _available(self) -> None:
        self.outage.answered(PART)

    # -- shutdown -------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Let running attempts finish within `shutdown_timeout`, then cancel them (the
        worker's last event, `worker.shutdown`, is the supervisor's, once every part stopped)."""
        running = set(self._tasks)
        cancelled = 0
        if running:
            _done, pending = await asyncio.wait(running, timeout=self.shutdown_timeout)
            for task in pending:
                task.cancel()
            cancelled = len(pending)
            if pending:
                await asyncio.wait(pending, timeout=self.shutdown_timeout)
        self.waited_for, self.cancelled = len(running), cancelled
        if self._notes:
            await asyncio.wait(set(self._notes), timeout=self.shutdown_timeout)


def _emit_paused(action: Paused, replica: str) -> None:
    pause = action.pause
    events.emit(
        "run.paused",
        "slots fell inside a pause of the job: not started",
        job=action.job.name,
        count=action.count,
        first=action.first.isoformat(),
        last=action.last.isoformat(),
        key=action.job.key_for(action.last),
        slot=action.last.isoformat(),
        paused_by=pause.paused_by,
        paused_at=pause.paused_at.isoformat(),
        resumed_at=pause.resumed_at.isoformat() if pause.resumed_at else None,
        replica=replica,
    )


def _emit_missed(missed: Missed, replica: str) -> None:
    events.emit(
        "run.missed",
        "slots came due but will not run",
        level=logging.WARNING,
        job=missed.job.name,
        count=missed.count,
        first=missed.first.isoformat(),
        last=missed.last.isoformat(),
        key=missed.job.key_for(missed.last),
        slot=missed.last.isoformat(),
        reason=missed.reason,
        catch_up=missed.job.catch_up,
        replica=replica,
    )


def _emit_overlap(skipped: OverlapSkipped, replica: str) -> None:
    events.emit(
        "run.overlap_skipped",
        "the job's previous slot is still running; not starting this one",
        job=skipped.job.name,
        key=skipped.job.key_for(skipped.slot),
        slot=skipped.slot.isoformat(),
        running=skipped.running.isoformat() if skipped.running else None,
        replica=replica,
    )
