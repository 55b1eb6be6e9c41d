"""Django's Tasks framework on oncely's queue: `TASKS = {"default": {"BACKEND":
"oncely.contrib.django.TaskBackend"}}`.

`my_task.enqueue(...)` inserts the task's row in `oncely_tasks` on Django's connection, inside
the caller's `transaction.atomic()` when there is one: the task exists iff that block commits
(no `transaction.on_commit` needed). Outside an atomic block, Django's autocommit commits the
row at once. `run_attempt` is what a worker calls, in a thread, to run one leased task: the
task's ORM work and its ack commit together, in one `atomic()` on Django's connection.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from django.db import close_old_connections, connections, transaction

from ...errors import BadInputError, LeaseLostError
from ...model import TaskRecord, TaskState
from ...store import borrowed
from ...tasks import check_json, report_enqueued
from .connection import default_alias, lent

try:  # Django 6
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2: the django-tasks backport, the same API
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef, unused-ignore]
    from django_tasks.base import (  # type: ignore[no-redef, unused-ignore]
        Task,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef, unused-ignore]

ARGS, KWARGS = "args", "kwargs"
"""A Django task's row keeps its call as {"args": [...], "kwargs": {...}} in `args`."""

_STATUS = {
    TaskState.AVAILABLE: TaskResultStatus.READY,
    TaskState.RUNNING: TaskResultStatus.RUNNING,
    TaskState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    TaskState.DISCARDED: TaskResultStatus.FAILED,
    TaskState.DEAD: TaskResultStatus.FAILED,
}


class TaskBackend(BaseTaskBackend):
    """oncely's queue as a `django.tasks` backend (see the module's docstring).

    OPTIONS: `DATABASE`, the alias whose connection enqueues (default `ONCELY["DATABASE"]`,
    else "default"). Queue names map to oncely queues; `run_after` to the task's run_at.
    Priorities are not supported yet (oncely's queue has none): a task with another
    priority than the default is refused. `get_result` reads the row back: status, times
    and the last error; return values are not stored yet, so `return_value` is None.
    """

    supports_defer = True
    supports_async_task = False
    supports_get_result = True
    supports_priority = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.using: str | None = self.options.get("DATABASE")

    @property
    def database(self) -> str:
        """The Django database alias the backend's rows live in."""
        return self.using or default_alias()

    def enqueue(self, task: Task, args: Any, kwargs: Any, **extra: Any) -> TaskResult:
        """Insert the task's row on Django's connection, in the caller's transaction."""
        return self.enqueue_keyed(task, args, kwargs, idempotency_key=None)

    def enqueue_keyed(
        self, task: Task, args: Any, kwargs: Any, *, idempotency_key: str | None
    ) -> TaskResult:
        """`enqueue` with an idempotency key: a key enqueued before (per task) inserts
        nothing and returns the existing task's result."""
        self.validate_task(task)
        payload = {ARGS: list(args), KWARGS: dict(kwargs)}
        check_json(payload, f"task {task.module_path}")
        entry = {
            "task": task.module_path,
            "queue": task.queue_name,
            "args": payload,
            "idempotency_key": idempotency_key,
            "run_at": task.run_after,
        }
        with _atomic(self.database), lent(self.database, f"{task.module_path}.enqueue()") as conn:
            (record,) = borrowed.enqueue(conn, [entry])
        report_enqueued([record])
        return self._result(task, record)

    def get_result(self, result_id: str) -> TaskResult:
        """The task's row as a TaskResult (no return value: see the class docstring)."""
        from .models import TaskRow

        try:
            row = TaskRow.objects.using(self.database).get(id=int(result_id))
        except (ValueError, TaskRow.DoesNotExist):
            raise TaskResultDoesNotExist(result_id) from None
        func = _import(row.task)
        task = func if isinstance(func, Task) else None
        if task is None:
            raise TaskResultDoesNotExist(f"{result_id}: {row.task} is not a task")
        return self._result(task, row.record())

    def _result(self, task: Task, record: TaskRecord) -> TaskResult:
        call = record.args if isinstance(record.args, dict) else {}
        result = TaskResult(
            task=task.using(queue_name=record.queue, run_after=record.run_at),
            id=str(record.id),
            status=_STATUS[record.state],
            enqueued_at=record.created_at,
            started_at=record.started_at,
            finished_at=record.finished_at,
            last_attempted_at=record.started_at,
            args=list(call.get(ARGS, [])),  # type: ignore[call-overload]
            kwargs=dict(call.get(KWARGS, {})),  # type: ignore[call-overload]
            backend=self.alias,
            errors=_errors(record),
            worker_ids=[record.locked_by] if record.locked_by else [],
        )
        return result


def _errors(record: TaskRecord) -> list[TaskError]:
    """The row's last error (`Type: message`, then its traceback) as Django's TaskError: the
    only one kept (oncely records the last attempt's error, not each one)."""
    if not record.error:
        return []
    kind = record.error.split(":", 1)[0].strip()
    return [TaskError(exception_class_path=kind, traceback=record.error)]


def enqueue(
    task: Task, *args: Any, idempotency_key: str | None = None, **kwargs: Any
) -> TaskResult:
    """`task.enqueue(*args, **kwargs)` with an oncely idempotency key (one task per key)."""
    backend = task.get_backend()
    if not isinstance(backend, TaskBackend):
        raise BadInputError(
            f"{task.module_path} uses the {type(backend).__name__} backend: idempotency keys "
            "need oncely.contrib.django.TaskBackend"
        )
    return backend.enqueue_keyed(task, args, kwargs, idempotency_key=idempotency_key)


@contextlib.contextmanager
def _atomic(using: str) -> Iterator[None]:
    """The caller's atomic block if it has one (the row commits with it), else one of the
    insert's own (committed at once, as Django's autocommit would)."""
    if connections[using].in_atomic_block:
        yield
        return
    with transaction.atomic(using=using):
        yield


def _import(path: str) -> Any:
    module, _, name = path.rpartition(".")
    if not module:
        raise BadInputError(f"{path!r} is not a dotted path to a function")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise BadInputError(f"cannot import {path!r}: {exc}") from exc


def run_attempt(
    alias: str,
    func_path: str,
    args: list[Any],
    kwargs: dict[str, Any],
    ack_sql: Any,
    ack_params: Any,
) -> Any:
    """Run one leased task on Django's connection `alias` and ack it in the same transaction.

    Synchronous, for a worker thread. Inside `transaction.atomic(using=alias)`: call the
    function at `func_path` (a `django.tasks` Task, or a plain function) with `args` and
    `kwargs`, then execute `ack_sql` with `ack_params` on the same connection (a SQLAlchemy
    statement, e.g. oncely's ack compare-and-set, or SQL text with :name parameters). The
    ack must match a row (RETURNING rows or a rowcount > 0); if it matches none, the lease
    was lost: LeaseLostError is raised and the block rolls back, the task's ORM work with
    it. Returns what the function returned. The task's own exception propagates (rolled
    back, no ack), for the worker to record the retry.
    """
    _close_stale(alias)
    try:
        target = _import(func_path)
        func = target.func if isinstance(target, Task) else target
        with transaction.atomic(using=alias):
            value = func(*args, **kwargs)
            with lent(alias, f"the ack of {func_path}") as conn:
                result = borrowed.execute(conn, ack_sql, ack_params)
                matched = len(result.all()) if result.returns_rows else result.rowcount
            if not matched:
                raise LeaseLostError(
                    f"the ack of {func_path} matched no row: its lease was lost, so its work "
                    "was rolled back"
                )
        return value
    finally:
        _close_stale(alias)


def _close_stale(alias: str) -> None:
    """Django's per-request cleanup, for a worker thread: drop connections past their
    CONN_MAX_AGE or broken; never one inside an atomic block (a caller's transaction)."""
    if not connections[alias].in_atomic_block:
        close_old_connections()


__all__ = ["LeaseLostError", "TaskBackend", "enqueue", "run_attempt"]
