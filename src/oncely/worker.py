"""The worker loop: sleep until the earliest slot is due, run it through the runner, repeat.

Every replica can run it: there is no leader, the slot claim decides who runs each slot. The
decisions (what is due, catch-up, overlap, busy retries) are scheduler.py's; this module does
the I/O around them: the clock, the ledger, attempts as asyncio tasks, database outages
(capped, jittered backoff, never dying) and a graceful shutdown (stop taking slots, let the
running attempts finish within `shutdown_timeout`, then cancel them: they roll back).

`serve()` runs the worker's components under one stop event; the scheduled-job loop is one
of them, and other long-running components (the task queue) join the same list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import clock, config, events, queue
from .errors import ConfigError, DatabaseUnavailableError, OncelyError
from .identity import replica_id
from .model import Pause, RunStatus
from .registry import Job
from .runner import paused, run_slot
from .scheduler import Missed, OverlapSkipped, Run, Scheduler
from .work.tasks import TaskWorker

if TYPE_CHECKING:
    from .app import Oncely

MAX_SLEEP = 30.0
"""The longest the loop sleeps without looking at the clock again (guards against clock jumps)."""
OUTAGE_BACKOFF_FIRST = 0.25
"""Seconds before the first retry after the database became unreachable; doubles each time."""
OUTAGE_BACKOFF_MAX = 5.0
"""The longest wait between two tries while the database is unreachable (before jitter)."""
DEFAULT_SHUTDOWN_TIMEOUT = config.SHUTDOWN_TIMEOUT
"""Seconds running attempts get to finish after SIGTERM before they are cancelled (rolled
back, tasks handed back): inside Kubernetes' default 30 s grace period, with room to spare
for the hand-back and the exit before SIGKILL."""
DEFAULT_STARTUP_WAIT = config.STARTUP_WAIT
"""Seconds a starting worker waits for an unreachable database before giving up (exit 2)."""
CLOCK_CHECK_EVERY = 60.0
"""Seconds between two readings of the database's clock (slots come due by it)."""
CLOCK_REPORT_DRIFT = timedelta(milliseconds=500)
CLOCK_WARN_OFFSET = timedelta(seconds=2)

Clock = Callable[[], datetime]


@dataclass
class _Outage:
    since: float
    tries: int = 0
    error: str = ""


class JobWorker:
    """Runs the due slots of some jobs until `stopping` is set."""

    def __init__(
        self,
        app: Oncely,
        stopping: asyncio.Event,
        *,
        jobs: Iterable[Job] | None = None,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        startup_wait: float = DEFAULT_STARTUP_WAIT,
        now: Clock = clock.utcnow,
        replica: str | None = None,
    ) -> None:
        self.app = app
        self.store = app.store
        self.stopping = stopping
        self.jobs = list(jobs if jobs is not None else app.registry)
        self.shutdown_timeout = shutdown_timeout
        self.startup_wait = startup_wait
        self._local_now = now
        self._offset = timedelta(0)
        self._offset_read_at: float | None = None
        self.replica = replica or replica_id()
        self.scheduler = Scheduler(self.jobs, now())
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._notes: set[asyncio.Task[None]] = set()
        """Records of slots not started (overlap, missed), written beside the loop."""
        self._outage: _Outage | None = None
        self._rng = random.Random()
        self.waited_for = 0
        """Attempts running when the worker was asked to stop."""
        self.cancelled = 0
        """Of those, attempts cancelled after `shutdown_timeout` (rolled back)."""

    def now(self) -> datetime:
        """The time slots come due by: this host's clock, corrected to the database's."""
        return self._local_now() + self._offset

    async def _read_clock(self) -> None:
        """Measure how far this host's clock is from the database's (Postgres; 0 on SQLite).

        A replica whose clock is ahead would otherwise run slots early, one behind late.
        """
        before = self._local_now()
        started = time.monotonic()
        db_now = await self.store.database_time()
        elapsed = time.monotonic() - started
        offset = db_now - (before + timedelta(seconds=elapsed / 2))
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
        self.scheduler.started = self.now()
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
        tries = self._outage.tries if self._outage is not None else 0
        if self._outage is not None:
            self._outage.tries += 1
        backoff = min(OUTAGE_BACKOFF_MAX, OUTAGE_BACKOFF_FIRST * 2.0**tries)
        return backoff * self._rng.uniform(0.5, 1.5)

    async def _wait_stop(self, seconds: float) -> bool:
        """Wait up to `seconds` for the stop event; whether it is set."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return self.stopping.is_set()

    async def _tick(self) -> None:
        if self._offset_read_at is None or (
            time.monotonic() - self._offset_read_at > CLOCK_CHECK_EVERY
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
                last = await self.store.last_slots()
                resumed = await self.store.control.last_resumes()
            except OncelyError as exc:  # unreachable, or a statement failed: back off, retry
                self._unavailable(exc)
                return
            self._available()
            for name in unsynced:
                self.scheduler.sync(name, _latest(last.get(name), resumed.get(name)))
            now = self.now()
        actions = self.scheduler.due(now)
        runs = [a for a in actions if isinstance(a, Run)]
        pauses = await self._pauses(runs, now) if runs else {}
        for action in actions:
            if isinstance(action, Run):
                pause = pauses.get(action.job.name)
                if pause is None:
                    self._start(action)
                else:
                    self._paused(action, pause, now)
            elif isinstance(action, Missed):
                _emit_missed(action, self.replica)
                self._note(action.job, None, action.first, "missed", action.last, action.reason)
            elif isinstance(action, OverlapSkipped):
                _emit_overlap(action, self.replica)
                key = action.job.key_for(action.slot)
                self._note(action.job, key, action.slot, "overlap")

    async def _pauses(self, runs: list[Run], now: datetime) -> dict[str, Pause]:
        """The pauses in force, read once per step in which slots come due; if they cannot
        be read, the due slots are retried later (as after an outage)."""
        try:
            found = await self.store.control.pauses()
        except OncelyError as exc:
            self._unavailable(exc)
            for run in runs:
                for slot in run.slots:
                    self.scheduler.finished(run.job, slot, None, now)
            return {run.job.name: _UNREAD for run in runs}
        return found

    def _paused(self, run: Run, pause: Pause, now: datetime) -> None:
        """Settle the slots of a paused job without starting them (they are not caught up on
        resume); an unread pause (the database failed) leaves them to be retried."""
        if pause is _UNREAD:
            return
        for slot in run.slots:
            self.scheduler.finished(run.job, slot, RunStatus.PAUSED, now)
            fields = {"job": run.job.name, "key": run.job.key_for(slot), "slot": slot.isoformat()}
            with events.routine():
                paused(run.job, slot, fields["key"], pause, {**fields, "replica": self.replica})

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
        running attempt's write lock); best effort."""

        async def write() -> None:
            with contextlib.suppress(OncelyError):
                await self.store.control.note(
                    job.name, key, slot, outcome, self.replica, slot_last=last, reason=reason
                )

        task = asyncio.create_task(write())
        self._notes.add(task)
        task.add_done_callback(self._notes.discard)

    async def _sleep(self) -> None:
        delay = MAX_SLEEP
        wake = self.scheduler.next_wake()
        if wake is not None:
            delay = min(delay, max(0.0, (wake - self.now()).total_seconds()))
        if self._outage is not None:
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
                status = await self._attempt_one(job, slot)
                self.scheduler.finished(job, slot, status, self.now())
                if status is None and self._outage is not None:
                    for rest in run.slots[index + 1 :]:
                        self.scheduler.finished(job, rest, None, self.now())
                    return
        except asyncio.CancelledError:
            self.scheduler.abandon(job, run.slots)
            raise
        finally:
            self._wake.set()

    async def _attempt_one(self, job: Job, slot: datetime) -> RunStatus | None:
        """One attempt; the outcome, or None if the database failed (retried later)."""
        latency_ms = round((self.now() - slot).total_seconds() * 1000, 1)
        key = ""
        try:
            key = job.key_for(slot)
            with events.routine():  # another replica winning the slot is routine: DEBUG
                result = await run_slot(
                    self.store, job, slot, key, self.replica, context={"latency_ms": latency_ms}
                )
        except DatabaseUnavailableError as exc:
            self._unavailable(exc)
            return None
        except Exception as exc:
            retry = isinstance(exc, OncelyError) and not isinstance(exc, ConfigError)
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
            return None if retry else RunStatus.FAILED
        error = result.error
        if result.status is RunStatus.FAILED and error and self.store.is_unavailable(error):
            self._unavailable(error)
            return None
        self._available()
        return result.status

    # -- database outages -----------------------------------------------------------------

    def _unavailable(self, exc: BaseException) -> None:
        if self._outage is None:
            self._outage = _Outage(since=time.monotonic(), error=str(exc))
            events.emit(
                "worker.db_unavailable",
                "the database is unreachable; retrying with backoff",
                level=logging.WARNING,
                replica=self.replica,
                error=str(exc),
            )

    def _available(self) -> None:
        if self._outage is not None:
            down = time.monotonic() - self._outage.since
            self._outage = None
            events.emit(
                "worker.db_reconnected",
                "the database is back; catching up",
                replica=self.replica,
                down_ms=round(down * 1000, 1),
            )

    # -- shutdown -------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Let running attempts finish within `shutdown_timeout`, then cancel them (the
        worker's last event, `worker.shutdown`, is serve()'s, once every component stopped)."""
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


def _latest(*times: datetime | None) -> datetime | None:
    known = [t for t in times if t is not None]
    return max(known) if known else None


_UNREAD = Pause(job="", paused_at=datetime.min, paused_by="", reason=None)
"""Stands for "the pauses could not be read" (the due slots are retried later)."""


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


# -- running the worker's components ---------------------------------------------------------


def components(
    app: Oncely,
    stopping: asyncio.Event,
    *,
    jobs: Iterable[Job] | None = None,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    startup_wait: float = DEFAULT_STARTUP_WAIT,
    concurrency: int = queue.DEFAULT_CONCURRENCY,
    lease: float | None = None,
    queues: list[str] | None = None,
    pool_size: int = queue.DEFAULT_POOL_SIZE,
) -> list[Coroutine[Any, Any, None]]:
    """The long-running parts of a worker, all stopped by the same event.

    The scheduled-job loop runs the selected jobs; the task queue's consumer runs the app's
    tasks (`concurrency` at once, on `pool_size` connections; 0 turns it off) with the same
    graceful stop.
    """
    return _Parts(
        app,
        stopping,
        jobs=jobs,
        shutdown_timeout=shutdown_timeout,
        startup_wait=startup_wait,
        concurrency=concurrency,
        lease=lease,
        queues=queues,
        pool_size=pool_size,
    ).parts


class _Parts:
    """A worker's components, kept to report what the shutdown did once they all stopped."""

    def __init__(
        self,
        app: Oncely,
        stopping: asyncio.Event,
        *,
        jobs: Iterable[Job] | None,
        shutdown_timeout: float,
        startup_wait: float,
        concurrency: int,
        lease: float | None,
        queues: list[str] | None,
        pool_size: int = queue.DEFAULT_POOL_SIZE,
    ) -> None:
        self.parts: list[Coroutine[Any, Any, None]] = []
        self.loop: JobWorker | None = None
        self.consumer: TaskWorker | None = None
        selected = list(jobs) if jobs is not None else list(app.registry)
        if selected:
            self.loop = JobWorker(
                app,
                stopping,
                jobs=selected,
                shutdown_timeout=shutdown_timeout,
                startup_wait=startup_wait,
            )
            self.parts.append(self.loop.run())
        if len(app.tasks) and concurrency > 0:
            self.consumer = queue.worker(
                app, concurrency=concurrency, lease=lease, queues=queues, pool_size=pool_size
            )
            consume = self.consumer.consume(stopping)
            self.parts.append(_stops_within(consume, stopping, shutdown_timeout))

    def report(self, stopped_at: float | None) -> None:
        """The worker's last event: what was running at the stop and what was cancelled."""
        loop, consumer = self.loop, self.consumer
        events.emit(
            "worker.shutdown",
            "worker stopped",
            replica=loop.replica if loop is not None else replica_id(),
            waited_for=loop.waited_for if loop is not None else 0,
            cancelled=(loop.cancelled if loop is not None else 0)
            + (consumer.handed_back if consumer is not None else 0),
            duration_ms=round((time.monotonic() - stopped_at) * 1000, 1)
            if stopped_at is not None
            else 0.0,
        )


async def _stops_within(
    part: Coroutine[Any, Any, None], stopping: asyncio.Event, timeout: float
) -> None:
    """Run `part`; once `stopping` is set, give it `timeout` seconds, then cancel it."""
    task = asyncio.create_task(part)
    stop = asyncio.create_task(stopping.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                events.emit(
                    "worker.cancelling",
                    "shutdown timeout reached; cancelling running tasks (rolled back)",
                    level=logging.WARNING,
                    replica=replica_id(),
                )
                task.cancel()
        await task
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def serve(
    app: Oncely,
    stopping: asyncio.Event,
    *,
    jobs: Iterable[Job] | None = None,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    startup_wait: float = DEFAULT_STARTUP_WAIT,
    handle_signals: bool = False,
    concurrency: int = queue.DEFAULT_CONCURRENCY,
    lease: float | None = None,
    queues: list[str] | None = None,
    pool_size: int = queue.DEFAULT_POOL_SIZE,
) -> None:
    """Run every component until `stopping` is set (or SIGTERM/SIGINT, with handle_signals)."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if handle_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, _on_signal, stopping, sig)
                installed.append(sig)
    parts = _Parts(
        app,
        stopping,
        jobs=jobs,
        shutdown_timeout=shutdown_timeout,
        startup_wait=startup_wait,
        concurrency=concurrency,
        lease=lease,
        queues=queues,
        pool_size=pool_size,
    )
    tasks = [asyncio.create_task(part) for part in parts.parts]
    stopped_at: list[float] = []
    watch = asyncio.create_task(_when_set(stopping, stopped_at))
    try:
        await _until_all_done_or_one_fails(tasks, stopping)
    finally:
        watch.cancel()
        for sig in installed:
            loop.remove_signal_handler(sig)
        parts.report(stopped_at[0] if stopped_at else None)


async def _when_set(stopping: asyncio.Event, at: list[float]) -> None:
    await stopping.wait()
    at.append(time.monotonic())


def _on_signal(stopping: asyncio.Event, sig: int) -> None:
    events.emit(
        "worker.stopping",
        "signal received; finishing running attempts",
        signal=signal.Signals(sig).name,
        replica=replica_id(),
    )
    stopping.set()


async def _until_all_done_or_one_fails(
    tasks: list[asyncio.Task[None]], stopping: asyncio.Event
) -> None:
    """Wait for every component; if one fails, stop the others and re-raise its error."""
    if not tasks:
        await stopping.wait()
        return
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in done if not t.cancelled() and t.exception() is not None]
        if failed:
            stopping.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise failed[0].exception()  # type: ignore[misc]
    except asyncio.CancelledError:
        stopping.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
