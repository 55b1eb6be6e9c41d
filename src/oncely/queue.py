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
from .errors import BadInputError, OncelyError, TaskStateError
from .model import TaskRecord, TaskState
from .store import Store
from .work.tasks import TaskWorker

DEFAULT_LEASE = config.LEASE
DEFAULT_CONCURRENCY = config.CONCURRENCY
DEFAULT_POOL_SIZE = config.POOL_SIZE
MAX_BATCH = config.BATCH
DEFAULT_POLL = config.POLL


class App(Protocol):
    """What these functions use of an `Oncely`."""

    @property
    def store(self) -> Store: ...

    def task_worker(self, **options: Any) -> TaskWorker: ...

    async def consume(self, stopping: asyncio.Event, **options: Any) -> None: ...

    async def list_tasks(
        self, state: TaskState | None = None, task: str | None = None, limit: int = 50
    ) -> list[TaskRecord]: ...

    async def unrunnable_tasks(self) -> dict[str, int] | None: ...


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


# The three below write no audit row (as in 0.1.0); `Oncely.retry_task`, `discard_task` and
# `prune`, which the CLI calls, write one.


async def retry_task(app: App, task_id: int) -> TaskRecord:
    """Run a dead, discarded or waiting task again now, with a fresh set of attempts."""
    rec = await app.store.tasks.retry_now(task_id)
    if rec is None:
        raise _state_error(
            await app.store.tasks.get(task_id), task_id, "retried", "dead, discarded or available"
        )
    return rec


async def discard_task(app: App, task_id: int) -> TaskRecord:
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


async def prune(app: App, older_than: timedelta, now: datetime | None = None) -> tuple[int, int]:
    """Delete tasks finished, and slot claims made, more than `older_than` ago.

    A claim is what stops a slot from running twice: prune only claims older than the longest
    catch-up window plus retry horizon of any job, or an old slot could run again.
    """
    if older_than <= timedelta(0):
        raise BadInputError(f"--older-than must be positive, got {older_than}")
    return await app.store.tasks.prune((now or await app.store.database_time()) - older_than)
