"""A queue task as a toolkit target: `TaskRun(app, task, idempotency_key=..., **kwargs)`.

Delivering it is what an at-least-once producer and a worker do together: enqueue the task
with its idempotency key (a second delivery's enqueue finds the existing task and inserts
nothing), then run worker passes on the task's queue until that task has an outcome. The
outcome is `ran` (this delivery's attempt succeeded), `skipped` (the task had already
succeeded, another worker ran it, or this attempt lost its lease), `failed` (the attempt
raised: rolled back, retried or ended per its policy; or the task is dead or discarded), or
`busy` (the task waits for a retry that is not due yet). The key a delivery reports is the
task's id, as `hooks.before_commit(task, str(id))` reports it at the batch's commit.

A delivery stopped between its work and its commit (a SIGKILL, or `SimulatedCrash`) leaves
the task leased; the retry's pass takes it over once that lease runs out, as a real worker's
rescuer would: keep `lease` short in tests.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from datetime import timezone
from typing import Any

from ..app import Oncely
from ..errors import BadInputError, OncelyError
from ..model import TaskRecord, TaskState
from ..store import Store
from ..tasks import Task
from ..work.options import WorkerOptions
from ..work.tasks import TaskWorker
from ..work.tasks.outcome import Dead, LeaseLost, Outcome, Succeeded
from .targets import Delivery, _point, database_url, reference, register_target_kind, resolve

DEFAULT_LEASE = 2.0
"""Seconds a delivery's worker leases the task for: how long a retry waits after a crash."""
TIMEOUT = 60.0
"""Seconds a delivery may take beyond its lease before it reports `failed`."""
POLL = 0.02


def _delivered(outcome: Outcome, key: str) -> Delivery:
    """A delivery's result from its attempt's outcome."""
    if isinstance(outcome, Succeeded):
        return Delivery(status="ran", key=key, pid=_pid())
    if isinstance(outcome, LeaseLost):
        return Delivery(status="skipped", key=key, pid=_pid())
    error = outcome.error if not isinstance(outcome, Dead) or outcome.error else None
    text = (
        f"{type(error).__name__}: {error}" if error is not None else getattr(outcome, "text", None)
    )
    return Delivery(status="failed", key=key, error=text, pid=_pid())


class TaskRun:
    """One message for a queue task: `task(**kwargs)` with `idempotency_key`, delivered by
    enqueueing it and running a worker pass for it.

    `app` and `task` may be given as `module:name` references or the objects themselves
    (module level, for deliveries from child processes); `kwargs` must be JSON. `lease` is
    the delivery worker's lease in seconds (reserved: a task argument cannot be called so).
    """

    def __init__(
        self,
        app: Oncely | str,
        task: Task | str,
        *,
        idempotency_key: str,
        lease: float = DEFAULT_LEASE,
        **kwargs: Any,
    ) -> None:
        self.app: Oncely = resolve(app) if isinstance(app, str) else app
        self._app_ref = app if isinstance(app, str) else None
        found = self.app.tasks.get(task if isinstance(task, str) else task.name)
        if not isinstance(task, str) and found is not task:
            raise BadInputError(f"task {task.name!r} is not registered in this app")
        self.task: Task = found
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise BadInputError(
                "TaskRun needs an idempotency_key: a redelivered message carries the same key, "
                "which is how the queue knows it is the same task"
            )
        if isinstance(lease, bool) or not isinstance(lease, (int, float)) or lease <= 0:
            raise BadInputError(f"lease must be > 0 seconds, got {lease!r}")
        self.idempotency_key = idempotency_key
        self.lease = float(lease)
        self.kwargs = kwargs
        self.task.entry(kwargs, idempotency_key)  # bad arguments fail here, not in a child

    def describe(self) -> str:
        return f"task {self.task.name}(**{self.kwargs!r}) key {self.idempotency_key!r}"

    def to_spec(self) -> dict[str, Any]:
        return {
            "kind": "task",
            "app": self._app_ref or reference(self.app),
            "task": self.task.name,
            "idempotency_key": self.idempotency_key,
            "lease": self.lease,
            "kwargs": self.kwargs,
            "database_url": database_url(self.app),
        }

    async def deliver(self) -> Delivery:
        try:
            rec = await self._enqueue()
        except OncelyError as exc:
            return Delivery(status="failed", error=f"{type(exc).__name__}: {exc}", pid=_pid())
        key = str(rec.id)
        if rec.duplicate and rec.state is TaskState.SUCCEEDED:
            return Delivery(status="skipped", key=key, pid=_pid())
        if rec.duplicate and rec.state in (TaskState.DEAD, TaskState.DISCARDED):
            return _ended(rec)
        return await self._pass(rec.id)

    # -- the producer ---------------------------------------------------------------------

    async def _enqueue(self) -> TaskRecord:
        store = self.app.store
        await store.ensure_schema()
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                return await self.task.enqueue_committed(
                    store, idempotency_key=self.idempotency_key, **self.kwargs
                )
            except OncelyError as exc:
                if not store.is_busy(exc):
                    raise
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(POLL)

    # -- the worker -----------------------------------------------------------------------

    async def _pass(self, task_id: int) -> Delivery:
        """Lease and run the task's queue until this task has an outcome for this delivery."""
        app, store = self.app, self.app.store
        key = str(task_id)
        worker = TaskWorker(
            store,
            app.tasks,
            WorkerOptions(concurrency=1, lease=self.lease, queues=(self.task.queue,)),
        )
        deadline = time.monotonic() + TIMEOUT + self.lease
        stop = asyncio.Event()
        heartbeat = asyncio.create_task(worker.keep_leases(stop))
        rescued_at = 0.0
        try:
            while True:
                if time.monotonic() > deadline:
                    return Delivery(
                        status="failed",
                        key=key,
                        error=f"task {task_id} had no outcome within {TIMEOUT + self.lease}s",
                        pid=_pid(),
                    )
                if time.monotonic() - rescued_at > min(0.25, self.lease / 4):
                    await _quietly(store, store.tasks.rescue())  # a crashed attempt's lease
                    rescued_at = time.monotonic()
                outcomes: list[Outcome] = await _quietly(store, worker.step())
                mine = [o for o in outcomes if o.item.id == task_id]
                if mine:
                    return _delivered(mine[0], key)
                if outcomes:
                    continue
                done = await self._settled(task_id)
                if done is not None:
                    return done
                await asyncio.sleep(POLL)
        finally:
            stop.set()
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)

    async def _settled(self, task_id: int) -> Delivery | None:
        """The outcome for a delivery that could not lease the task, or None to keep waiting
        (another worker holds it, or it just became due)."""
        rec = await self.app.store.tasks.get(task_id)
        key = str(task_id)
        if rec is None:
            return Delivery(status="failed", key=key, error=f"task {task_id} is gone", pid=_pid())
        if rec.state is TaskState.SUCCEEDED:
            return Delivery(status="skipped", key=key, pid=_pid())  # another worker ran it
        if rec.state in (TaskState.DEAD, TaskState.DISCARDED):
            return _ended(rec)
        if rec.state is TaskState.AVAILABLE:
            run_at = rec.run_at if rec.run_at.tzinfo else rec.run_at.replace(tzinfo=timezone.utc)
            if run_at > await self.app.store.database_time():
                return Delivery(
                    status="busy",
                    key=key,
                    error=f"task {task_id} waits for its retry at {run_at.isoformat()}",
                    pid=_pid(),
                )
        return None


async def _quietly(store: Store, call: Awaitable[list[Any]]) -> list[Any]:
    """Await a queue statement; a busy database (SQLite's write lock) counts as nothing done."""
    try:
        return await call
    except OncelyError as exc:
        if store.is_busy(exc):
            return []
        raise


def _ended(rec: TaskRecord) -> Delivery:
    error = (rec.error or "").splitlines()[0] if rec.error else None
    return Delivery(
        status="failed",
        key=str(rec.id),
        error=f"task {rec.id} is {rec.state.value}" + (f": {error}" if error else ""),
        pid=_pid(),
    )


def _pid() -> int:
    return os.getpid()


def _task_from_spec(spec: dict[str, Any]) -> TaskRun:
    app = resolve(spec["app"])
    _point(app, spec.get("database_url"))
    return TaskRun(
        app,
        spec["task"],
        idempotency_key=spec["idempotency_key"],
        lease=float(spec.get("lease", DEFAULT_LEASE)),
        **spec.get("kwargs", {}),
    )


register_target_kind("task", _task_from_spec)
