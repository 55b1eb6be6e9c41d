"""The task queue's entry points: `consume` (run a worker) and the operator's functions.

The worker itself is `oncely.work.tasks.TaskWorker`: each task runs in a transaction of its
own on a bounded pool, its work and its ack committed together (see docs/tasks.md).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import config
from .errors import BadInputError, OncelyError, TaskStateError
from .model import TaskRecord, TaskState
from .work.options import WorkerOptions
from .work.tasks import ANNOUNCE_EVERY, TaskWorker

if TYPE_CHECKING:
    from .app import Oncely

DEFAULT_LEASE = config.LEASE
DEFAULT_CONCURRENCY = config.CONCURRENCY
DEFAULT_POOL_SIZE = config.POOL_SIZE
MAX_BATCH = config.BATCH
DEFAULT_POLL = config.POLL


def worker(
    app: Oncely,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    lease: float | None = None,
    queues: list[str] | None = None,
    batch: int = MAX_BATCH,
    poll: float = DEFAULT_POLL,
    pool_size: int = DEFAULT_POOL_SIZE,
) -> TaskWorker:
    """A task worker for `app`'s tasks (`lease` defaults to `app.lease`)."""
    options = WorkerOptions.of(
        concurrency=concurrency,
        lease=lease if lease is not None else app.lease,
        queues=queues,
        batch=batch,
        poll=poll,
        pool_size=pool_size,
    )
    return TaskWorker(app.store, app.tasks, options)


async def consume(app: Oncely, stopping: asyncio.Event, **options: Any) -> None:
    """Run `app`'s tasks until `stopping` is set and the tasks in flight have ended.

    Up to `concurrency` tasks run at once, each in its own transaction on a pool of
    `pool_size` connections (taken at a task's first statement, given back at its commit);
    `lease` (default `app.lease`) is how long a silent worker keeps its tasks; `queues` limits
    which queues it serves (default all); `batch` caps the tasks leased in one statement;
    `poll` is the fallback wake-up interval in seconds. Cancelling the call rolls back the
    tasks in flight and hands them back at once.
    """
    await worker(app, **options).consume(stopping)


# -- operations -------------------------------------------------------------------------


async def list_tasks(
    app: Oncely,
    state: TaskState | None = None,
    task: str | None = None,
    limit: int = 50,
) -> list[TaskRecord]:
    """Tasks newest first, optionally of one state and one task."""
    return await app.store.tasks.listing(state, task, limit)


async def unrunnable(app: Oncely) -> dict[str, int] | None:
    """Available tasks that no live worker leases (none registers their name), by name, with
    how many wait; None if no worker is live (or this database does not record workers)."""
    return await app.store.tasks.unrunnable(3 * ANNOUNCE_EVERY)


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
