"""Django's Tasks framework on oncely's queue: `TASKS = {"default": {"BACKEND":
"oncely.contrib.django.TaskBackend"}}`.

`my_task.enqueue(...)` inserts the task's row in `oncely_tasks` on Django's connection, inside
the caller's `transaction.atomic()` when there is one: the task exists iff that block commits
(no `transaction.on_commit` needed). Outside an atomic block, Django's autocommit commits the
row at once. `run_attempt` is what a worker calls, in a thread, to run one leased task: the
task's ORM work and its ack commit together, in one `atomic()` on Django's connection,
with what the task returned stored as its result (read back by `get_result`).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import importlib
import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.db import close_old_connections, connections, transaction

from ... import hooks, tracing
from ...errors import BadInputError, ConfigError, LeaseLostError
from ...model import TaskRecord, TaskState
from ...retry import RetryPolicy
from ...store import AttemptGivenUp, Fence, borrowed
from ...tasks import AckFor, check_json, report_enqueued
from .connection import default_alias, lent

try:  # Django 6
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2: the django-tasks backport, the same API
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef, unused-ignore]
    from django_tasks.base import (  # type: ignore[no-redef, unused-ignore]
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef, unused-ignore]
        InvalidTaskError,
        TaskResultDoesNotExist,
    )

ARGS, KWARGS = "args", "kwargs"
"""A Django task's row keeps its call as {"args": [...], "kwargs": {...}} in `args`."""

_VALIDATED: dict[str, Task] = {}
"""The tasks an oncely backend validated in this process, by module path (the first seen):
what a worker of this process can run (see `discover`)."""

_STATUS = {
    TaskState.AVAILABLE: TaskResultStatus.READY,
    TaskState.RUNNING: TaskResultStatus.RUNNING,
    TaskState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    TaskState.DISCARDED: TaskResultStatus.FAILED,
    TaskState.DEAD: TaskResultStatus.FAILED,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class OncelyTask(Task):
    """A `django.tasks` Task of oncely's backend, with two options of its own where Django's
    `@task` passes its keyword arguments on to the backend's task class (Django 6.1, and the
    django-tasks backport): `retry`, a RetryPolicy or a dict of its arguments, and
    `timeout`, an attempt's limit in seconds or a timedelta. Checked as the module is
    imported: a bad value is Django's InvalidTaskError naming the task."""

    retry: Any = None
    timeout: Any = None

    def __post_init__(self) -> None:
        where = f"@task of {self.module_path}"
        try:
            if self.retry is not None:
                object.__setattr__(self, "retry", _policy(self.retry, f"{where}: retry"))
            if self.timeout is not None:
                object.__setattr__(self, "timeout", _seconds(self.timeout, f"{where}: timeout"))
        except ConfigError as exc:
            raise InvalidTaskError(str(exc)) from None
        super().__post_init__()


class TaskBackend(BaseTaskBackend):
    """oncely's queue as a `django.tasks` backend (see the module's docstring).

    OPTIONS: `DATABASE`, the alias whose connection enqueues (default `ONCELY["DATABASE"]`,
    else "default"); `RETRY`, the RetryPolicy of its tasks (a RetryPolicy or a dict of
    RetryPolicy's arguments; default oncely's default policy); `TASK_RETRY`, a policy per
    task ({module path: policy}); `TIMEOUT` and `TASK_TIMEOUT`, the same for an attempt's
    timeout (seconds or a timedelta; default none). Queue names map to oncely queues,
    `run_after` to the row's run_at and `priority` (-100..100) to oncely's priority (higher
    first). `get_result` reads the row back: status, times, attempts, every failed
    attempt's error and the stored return value.
    """

    task_class = OncelyTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.using: str | None = self.options.get("DATABASE")

    @property
    def database(self) -> str:
        """The Django database alias the backend's rows live in."""
        return self.using or default_alias()

    def validate_task(self, task: Task) -> None:
        """Django's checks, then the task is recorded for this process's worker."""
        super().validate_task(task)
        _VALIDATED.setdefault(task.module_path, task)

    def retry_policy(self, module_path: str, task: Task | None = None) -> RetryPolicy | None:
        """The task's RetryPolicy: OPTIONS' `TASK_RETRY` for it, else its own `@task(retry=)`,
        else OPTIONS' `RETRY`; None: oncely's default policy. ConfigError naming the setting
        if one is malformed."""
        own = task.retry if isinstance(task, OncelyTask) else None
        policy: RetryPolicy | None = self._option("RETRY", module_path, _policy, own)
        return policy

    def timeout(self, module_path: str, task: Task | None = None) -> float | None:
        """The task's attempt timeout in seconds: OPTIONS' `TASK_TIMEOUT` for it, else its
        own `@task(timeout=)`, else OPTIONS' `TIMEOUT`; None: no timeout. ConfigError
        naming the setting if one is malformed."""
        own = task.timeout if isinstance(task, OncelyTask) else None
        seconds: float | None = self._option("TIMEOUT", module_path, _seconds, own)
        return seconds

    def _option(
        self, name: str, module_path: str, parse: Callable[[Any, str], Any], own: Any = None
    ) -> Any:
        """OPTIONS[`TASK_<name>`][module_path], else the task's `own` value, else
        OPTIONS[name], parsed; else None."""
        where = f"TASKS[{self.alias!r}]['OPTIONS']"
        per_task = self.options.get(f"TASK_{name}", {})
        if not isinstance(per_task, dict):
            raise ConfigError(
                f"{where}['TASK_{name}'] must be a dict of module path to value, got "
                f"{type(per_task).__name__}"
            )
        if module_path in per_task:
            return parse(per_task[module_path], f"{where}['TASK_{name}'][{module_path!r}]")
        if own is not None:
            return own
        if name in self.options:
            return parse(self.options[name], f"{where}[{name!r}]")
        return None

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
            "priority": task.priority,  # Django's -100..100, higher first: as oncely's
        }
        with tracing.enqueuing(task.module_path, task.queue_name, [entry]) as span:
            with _atomic(self.database), lent(self.database, f"{task.module_path}.enqueue()") as c:
                (record,) = borrowed.enqueue(c, [entry])
            report_enqueued([record], span)
        return self._result(task, record)

    def get_result(self, result_id: str) -> TaskResult:
        """The task's row as a TaskResult: its status, times, attempts, every failed
        attempt's error (oldest first) and (once it succeeded) the value it returned.
        TaskResultDoesNotExist if there is no such row (never enqueued, or pruned)."""
        from .models import TaskRow

        try:
            row = TaskRow.objects.using(self.database).get(id=int(result_id))
        except (ValueError, TaskRow.DoesNotExist):
            raise TaskResultDoesNotExist(result_id) from None
        func = _import(row.task)
        task = func if isinstance(func, Task) else None
        if task is None:
            raise TaskResultDoesNotExist(f"{result_id}: {row.task} is not a task")
        return self._result(task, row.record(), [r.error for r in row.history()])

    def _result(
        self, task: Task, record: TaskRecord, history: Sequence[str | None] = ()
    ) -> TaskResult:
        call = record.args if isinstance(record.args, dict) else {}
        result = TaskResult(
            task=task.using(
                queue_name=record.queue, run_after=record.run_at, priority=record.priority
            ),
            id=str(record.id),
            status=_STATUS[record.state],
            enqueued_at=record.created_at,
            started_at=record.started_at,
            finished_at=record.finished_at,
            last_attempted_at=record.started_at,
            args=list(call.get(ARGS, [])),  # type: ignore[call-overload]
            kwargs=dict(call.get(KWARGS, {})),  # type: ignore[call-overload]
            backend=self.alias,
            errors=_errors(record, history),
            worker_ids=_worker_ids(record),
        )
        if record.state is TaskState.SUCCEEDED:  # Django's field for it is not an argument
            object.__setattr__(result, "_return_value", record.result)
        return result


def _policy(value: Any, where: str) -> RetryPolicy:
    if isinstance(value, RetryPolicy):
        return value
    if isinstance(value, dict):
        try:
            return RetryPolicy(**value)
        except TypeError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    raise ConfigError(
        f"{where} must be a RetryPolicy or a dict of its arguments, got {type(value).__name__}"
    )


def _seconds(value: Any, where: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ConfigError(f"{where} must be a number of seconds > 0 or a timedelta, got {value!r}")
    return float(seconds)


def _errors(record: TaskRecord, history: Sequence[str | None] = ()) -> list[TaskError]:
    """Every failed attempt's error (`Type: message`, then its traceback) as Django's
    TaskErrors, oldest first: the attempt history oncely kept (oncely_task_errors), then the
    row's last error if the history does not end with it (an operator's cancel, or a
    database older than schema 11, which kept only that one)."""
    texts = [text for text in history if text]
    if record.error and (not texts or texts[-1] != record.error):
        texts.append(record.error)
    return [TaskError(exception_class_path=_class_path(text), traceback=text) for text in texts]


def _class_path(error: str) -> str:
    """The error's class path: the traceback's last line's (`module.Class`; `builtins.` for
    a built-in one), else the first line's class name."""
    kind = error.split(":", 1)[0].strip()  # the class's name
    named = re.compile(rf"^((?:\w+\.)*{re.escape(kind)})(?::|$)")
    for line in reversed(error.splitlines()):  # the traceback's `module.Class: ...`
        found = named.match(line)
        if found and "." in found.group(1):
            return found.group(1)
    if "." not in kind and isinstance(getattr(builtins, kind, None), type):
        return f"builtins.{kind}"
    return kind


def _worker_ids(record: TaskRecord) -> list[str]:
    """One entry per attempt begun (Django's `attempts` counts them): the last one's worker
    last; oncely does not keep the workers of the earlier ones (empty strings)."""
    if record.attempt <= 0:
        return []
    return [""] * (record.attempt - 1) + [record.locked_by or ""]


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
    *,
    fence: Fence | None = None,
    task_id: int | None = None,
) -> Any:
    """Run one leased task on Django's connection `alias` and ack it in the same transaction.

    Synchronous, for a worker thread. Inside `transaction.atomic(using=alias)`: call the
    function at `func_path` (a `django.tasks` Task, or a plain function) with `args` and
    `kwargs`, then execute `ack_sql` with `ack_params` on the same connection (a SQLAlchemy
    statement, e.g. oncely's ack compare-and-set, or SQL text with :name parameters;
    `ack_params` may be a function returning them, called at the ack). The
    ack must match a row (RETURNING rows or a rowcount > 0); if it matches none, the lease
    was lost: LeaseLostError is raised and the block rolls back, the task's ORM work with
    it. Returns what the function returned. The task's own exception propagates (rolled
    back, no ack), for the worker to record the retry.

    With the worker's `fence`, the block commits only while holding `fence.lock` with the
    fence open: the lock is taken just before the block ends and released after its commit;
    a fence closed by then (the attempt was given up: a timeout, a cancel, a shutdown)
    rolls everything back and raises AttemptGivenUp. `hooks.before_commit(func_path,
    str(task_id))` is called just before the commit, as for oncely's own tasks.
    """

    def ack(value: Any) -> tuple[Any, Any]:
        return ack_sql, (ack_params() if callable(ack_params) else ack_params)

    target = _import(func_path)
    func = _callable(target.func if isinstance(target, Task) else target)
    return _run(alias, func_path, lambda: func(*args, **kwargs), ack, fence, task_id)


def _callable(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` as a plain call for the attempt's thread: an `async def` task runs to its end
    in an event loop of its own (`async_to_sync`), and the async ORM calls it awaits
    (`acreate`, `aget` …, Django's `sync_to_async`) run back on this thread, so on its
    connection, inside the attempt's atomic block: its ORM work commits with the ack."""
    if inspect.iscoroutinefunction(func):
        return async_to_sync(func)
    return func


def _run(
    alias: str,
    func_path: str,
    call: Callable[[], Any],
    ack: Callable[[Any], tuple[Any, Any]],
    fence: Fence | None,
    task_id: int | None,
) -> Any:
    """`call()` and then its ack, `ack(value)`'s statement and parameters, in one atomic
    block on `alias` (see `run_attempt`)."""
    _close_stale(alias)
    held = False
    try:
        with transaction.atomic(using=alias):
            value = call()
            with lent(alias, f"the ack of {func_path}") as conn:
                statement, params = ack(value)
                result = borrowed.execute(conn, statement, params)
                matched = len(result.all()) if result.returns_rows else result.rowcount
            if not matched:
                raise _AckMatchedNoRow(
                    f"the ack of {func_path} matched no row: its lease was lost, so its work "
                    "was rolled back"
                )
            if fence is not None:
                fence.lock.acquire()
                held = True
                if fence.closed:
                    raise AttemptGivenUp(
                        f"the attempt at {func_path} was given up (a timeout, a cancel or a "
                        "shutdown) before it could commit: its work was rolled back"
                    )
            hooks.before_commit(func_path, "" if task_id is None else str(task_id))
        return value
    finally:
        if held:
            fence.lock.release()  # type: ignore[union-attr]  # held: a fence was given
        _close_stale(alias)


class _AckMatchedNoRow(LeaseLostError):
    """run_attempt's own LeaseLostError (not one the task raised)."""


def attempt(alias: str, item: Any, ack: AckFor, fence: Fence) -> bool:
    """The worker's attempt at a leased Django task (`TaskRegistry.add(attempt=...)`): the
    row's call on Django's connection `alias` with its ack (`ack(value)`: storing what it
    returned), committed under `fence`. True if it committed, False if its lease was lost
    (rolled back); the task's error is raised. A task with `takes_context` is handed its
    TaskContext first: its TaskResult as the row says now (RUNNING, this attempt's number)."""
    args, kwargs = _call_of(item.id, item.args)
    target = _import(item.task)
    func = _callable(target.func if isinstance(target, Task) else target)
    if isinstance(target, Task) and target.takes_context:
        _close_stale(alias)
        context = TaskContext(task_result=backend_for(target, alias).get_result(str(item.id)))
        args = [context, *args]
    try:
        _run(alias, item.task, lambda: func(*args, **kwargs), ack, fence, item.id)
    except _AckMatchedNoRow:
        return False
    return True


def _call_of(task_id: int, payload: Any) -> tuple[list[Any], dict[str, Any]]:
    """A row's call: `{"args": [...], "kwargs": {...}}` as the backend's enqueue writes it,
    or keyword arguments alone, as oncely's own enqueue writes them (a schedule kept as
    data that runs the task)."""
    if not isinstance(payload, dict):
        raise BadInputError(f"task {task_id}: its args are not a Django task's call")
    if set(payload) == {ARGS, KWARGS}:
        args, kwargs = payload[ARGS], payload[KWARGS]
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise BadInputError(f"task {task_id}: its args are not a Django task's call")
        return args, kwargs
    return [], dict(payload)


def signature_shim(task: Task) -> Callable[..., Any]:
    """What oncely registers for a Django task: never called (the worker's `attempt` runs
    the task), its signature `(db, <the task's parameters>)` as oncely's enqueue checks
    keyword arguments against (a schedule's `args`, when it is added)."""
    params = list(inspect.signature(task.func).parameters.values())
    if task.takes_context:
        params = params[1:]

    def run_by_the_attempt(*args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{task.module_path} runs in the worker's attempt, not called here")

    db = inspect.Parameter("db", inspect.Parameter.POSITIONAL_ONLY)
    run_by_the_attempt.__signature__ = inspect.Signature([db, *params])  # type: ignore[attr-defined]
    run_by_the_attempt.__name__ = task.func.__name__
    return run_by_the_attempt


def discover() -> dict[str, Task]:
    """Import the `tasks` module of every app in INSTALLED_APPS and the modules of
    `ONCELY["TASK_MODULES"]`: the tasks an oncely backend validated (by module path)."""
    from django.utils.module_loading import autodiscover_modules

    from .connection import oncely_settings

    modules = oncely_settings().get("TASK_MODULES", [])
    if not isinstance(modules, (list, tuple)) or not all(isinstance(m, str) for m in modules):
        raise ConfigError("settings.ONCELY['TASK_MODULES'] must be a list of module names")
    try:
        autodiscover_modules("tasks")
    except Exception as exc:
        raise ConfigError(f"importing the tasks modules of INSTALLED_APPS: {exc!r}") from exc
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ConfigError(
                f"settings.ONCELY['TASK_MODULES']: cannot import {name!r}: {exc!r}"
            ) from exc
    return dict(_VALIDATED)


def backend_for(task: Task, alias: str) -> TaskBackend:
    """The oncely backend whose settings apply to `task`'s rows on the database `alias`:
    the task's own backend if its DATABASE is `alias`, else the first such in TASKS, else
    the task's own (an oncely one: it validated the task)."""
    try:
        from django.tasks import task_backends
    except ImportError:  # Django 5.2: the backport
        from django_tasks import task_backends  # type: ignore[no-redef, unused-ignore]
    from django.conf import settings

    own = task.get_backend()
    for backend in [own, *(task_backends[name] for name in getattr(settings, "TASKS", {}))]:
        if isinstance(backend, TaskBackend) and backend.database == alias:
            return backend
    assert isinstance(own, TaskBackend)  # only an oncely backend records a task
    return own


def _close_stale(alias: str) -> None:
    """Django's per-request cleanup, for a worker thread: drop connections past their
    CONN_MAX_AGE or broken; never one inside an atomic block (a caller's transaction)."""
    if not connections[alias].in_atomic_block:
        close_old_connections()


__all__ = [
    "AttemptGivenUp",
    "LeaseLostError",
    "OncelyTask",
    "TaskBackend",
    "attempt",
    "backend_for",
    "discover",
    "enqueue",
    "run_attempt",
]
