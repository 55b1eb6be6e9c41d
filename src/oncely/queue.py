"""The task queue's functions of 0.1.0, which take an app; new code calls `Oncely`'s methods.

The worker itself is `oncely.work.tasks.TaskWorker`, built by `Oncely.task_worker` from the
app's store, its task registry and a WorkerOptions: each task runs in a transaction of its own
on a bounded pool, its work and its ack committed together (see docs/tasks.md). This module
sits above the app and does not import it: it takes any object with the methods it calls.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any, Protocol

from . import config
from .model import TaskRecord, TaskState
from .work.tasks import TaskWorker

DEFAULT_LEASE = config.LEASE
DEFAULT_CONCURRENCY = config.CONCURRENCY
DEFAULT_POOL_SIZE = config.POOL_SIZE
MAX_BATCH = config.BATCH
DEFAULT_POLL = config.POLL


class App(Protocol):
    """What these functions use of an `Oncely`."""

    def task_worker(self, **options: Any) -> TaskWorker: ...

    async def consume(self, stopping: asyncio.Event, **options: Any) -> None: ...

    async def list_tasks(
        self, state: TaskState | None = None, task: str | None = None, limit: int = 50
    ) -> list[TaskRecord]: ...

    async def unrunnable_tasks(self) -> dict[str, int] | None: ...

    async def retry_task(self, task_id: int) -> TaskRecord: ...

    async def discard_task(self, task_id: int) -> TaskRecord: ...

    async def prune(
        self, older_than: timedelta, *, now: datetime | None = None
    ) -> dict[str, int]: ...


def worker(app: App, **options: Any) -> TaskWorker:
    """A task worker for `app`'s tasks: `app.task_worker(**options)` (concurrency, lease,
    queues, batch, poll, pool_size; `lease` defaults to `app.lease`)."""
    return app.task_worker(**options)


async def consume(app: App, stopping: asyncio.Event, **options: Any) -> None:
    """Run `app`'s tasks until `stopping` is set and the tasks in flight have ended:
    `app.consume(stopping, **options)`."""
    await app.consume(stopping, **options)


# -- operations -------------------------------------------------------------------------


async def list_tasks(
    app: App,
    state: TaskState | None = None,
    task: str | None = None,
    limit: int = 50,
) -> list[TaskRecord]:
    """Tasks newest first, optionally of one state and one task: `app.list_tasks`."""
    return await app.list_tasks(state, task, limit)


async def unrunnable(app: App) -> dict[str, int] | None:
    """Available tasks that no live worker leases, by name: `app.unrunnable_tasks()`."""
    return await app.unrunnable_tasks()


# The three below are `Oncely.retry_task`, `discard_task` and `prune`, which the CLI calls:
# each writes its audit row in the action's own transaction, as they do.


async def retry_task(app: App, task_id: int) -> TaskRecord:
    """Run a dead, discarded or waiting task again now, with a fresh set of attempts (audited):
    `app.retry_task(task_id)`."""
    return await app.retry_task(task_id)


async def discard_task(app: App, task_id: int) -> TaskRecord:
    """Discard a task that has not succeeded (audited); a running attempt of it then rolls
    back: `app.discard_task(task_id)`."""
    return await app.discard_task(task_id)


async def prune(app: App, older_than: timedelta, now: datetime | None = None) -> tuple[int, int]:
    """Delete what finished more than `older_than` before `now` (the database's clock by
    default), as `app.prune` does, in one audited transaction; how many tasks and claims.

    A claim is what stops a slot from running twice: prune only claims older than the longest
    catch-up window plus retry horizon of any job, or an old slot could run again.
    """
    counts = await app.prune(older_than, now=now)
    return counts["tasks"], counts["claims"]
