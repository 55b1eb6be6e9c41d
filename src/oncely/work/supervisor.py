"""The supervisor: runs the scheduled-job loop and the task worker under one stop event.

`serve()` waits up to `startup_wait` for a database that does not answer yet (it may be
starting up), builds each part from the store, the registries (jobs, tasks) and one
WorkerOptions, runs them until the stop event is set (or SIGTERM/SIGINT, when it handles
signals), stops the others if one fails, and writes the worker's last event, `worker.shutdown`.
The parts share one `Outage`: an outage while they run is said once per process, and waited
out by each part (it never ends the worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Coroutine
from typing import Any

from .. import events
from ..errors import DatabaseUnavailableError
from ..identity import replica_id
from ..registry import Registry
from ..store import Store
from ..tasks import TaskRegistry
from .jobs import JobWorker
from .options import WorkerOptions
from .outage import Outage
from .schedules import ScheduleWorker
from .tasks import TaskWorker


def components(
    store: Store,
    jobs: Registry,
    tasks: TaskRegistry,
    stopping: asyncio.Event,
    options: WorkerOptions,
) -> list[Coroutine[Any, Any, None]]:
    """The long-running parts of a worker, all stopped by the same event.

    The scheduled-job loop runs the jobs `options.jobs` names (default: all, and then the
    schedules kept as data, by their own loop, too); the task worker
    runs the registry's tasks (`options.concurrency` at once, on `options.pool_size`
    connections; 0 turns it off) with the same graceful stop.
    """
    return _Parts(store, jobs, tasks, stopping, options).parts


class _Parts:
    """A worker's components, kept to report what the shutdown did once they all stopped."""

    def __init__(
        self,
        store: Store,
        jobs: Registry,
        tasks: TaskRegistry,
        stopping: asyncio.Event,
        options: WorkerOptions,
    ) -> None:
        self.parts: list[Coroutine[Any, Any, None]] = []
        self.outage = outage = Outage(replica_id())
        self.job_worker: JobWorker | None = None
        self.task_worker: TaskWorker | None = None
        self.schedule_worker: ScheduleWorker | None = None
        selected = (
            [jobs.job(name) for name in options.jobs] if options.jobs is not None else list(jobs)
        )
        if len(tasks) and options.concurrency > 0:
            self.task_worker = TaskWorker(store, tasks, options, outage=outage)
        if selected:
            self.job_worker = JobWorker(store, selected, stopping, options, outage=outage)
            self.parts.append(self.job_worker.run())
        if options.jobs is None and options.schedule_poll and (len(jobs) or len(tasks)):
            # Schedules kept as data run what the app registers: a worker of all jobs
            # looks at them too (one indexed read per poll).
            self.schedule_worker = ScheduleWorker(
                store, jobs, tasks, stopping, options, outage=outage
            )
            self.parts.append(self.schedule_worker.run())
        if self.task_worker is not None:
            consume = self.task_worker.consume(stopping)
            self.parts.append(_stops_within(consume, stopping, options.shutdown_timeout))

    def report(self, stopped_at: float | None) -> None:
        """The worker's last event: what was running at the stop and what was cancelled."""
        job_worker, task_worker = self.job_worker, self.task_worker
        events.emit(
            "worker.shutdown",
            "worker stopped",
            replica=job_worker.replica if job_worker is not None else replica_id(),
            waited_for=job_worker.waited_for if job_worker is not None else 0,
            cancelled=(job_worker.cancelled if job_worker is not None else 0)
            + (task_worker.handed_back if task_worker is not None else 0),
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
    store: Store,
    jobs: Registry,
    tasks: TaskRegistry,
    stopping: asyncio.Event,
    options: WorkerOptions,
    *,
    handle_signals: bool = False,
) -> None:
    """Run every component until `stopping` is set (or SIGTERM/SIGINT, with handle_signals)."""
    parts = _Parts(store, jobs, tasks, stopping, options)
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if handle_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, _on_signal, stopping, sig)
                installed.append(sig)
    stopped_at: list[float] = []
    watch = asyncio.create_task(_when_set(stopping, stopped_at))
    try:
        reachable = False
        try:
            reachable = await _reachable(store, parts.outage, options.startup_wait, stopping)
        finally:
            if not reachable:  # refused, or stopped while waiting
                for part in parts.parts:
                    part.close()  # none of them started
        if not reachable:
            return
        running = [asyncio.create_task(part) for part in parts.parts]
        await _until_all_done_or_one_fails(running, stopping)
    finally:
        watch.cancel()
        for sig in installed:
            loop.remove_signal_handler(sig)
        parts.report(stopped_at[0] if stopped_at else None)


async def _reachable(
    store: Store, outage: Outage, startup_wait: float, stopping: asyncio.Event
) -> bool:
    """Wait until the database answers (its schema checked, a write possible), up to
    `startup_wait` seconds: a worker started while the server is down or starting up says so
    once (`worker.db_unavailable`) and starts when it answers. DatabaseUnavailableError past
    the wait; False if stopped meanwhile."""
    deadline = time.monotonic() + startup_wait
    while True:
        try:
            await store.ensure_schema(writes=True)
        except DatabaseUnavailableError as exc:
            if time.monotonic() >= deadline:
                raise
            outage.failed(STARTUP, exc, startup_wait_s=startup_wait)
            wait = min(outage.backoff(STARTUP), max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), wait)
            if stopping.is_set():
                return False
            continue
        outage.answered(STARTUP)
        return True


STARTUP = "startup"
"""The worker's wait for the database before its parts start, as a part of an outage."""


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
