"""Task definitions and enqueueing, in the caller's own transaction.

`@app.task(...)` turns `async def f(db, **kwargs)` (or a plain `def`) into a `Task`; its
`enqueue(db, **kwargs)` inserts one row in the transaction `db` is in, so the task exists iff
that transaction commits. Arguments are JSON only, checked here, before any SQL: anything else
raises PayloadError naming the argument. An idempotency key is unique per task among all
retained tasks; enqueueing it again creates nothing and returns the existing task.
"""

from __future__ import annotations

import inspect
import logging
import math
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from . import events
from .errors import (
    BadInputError,
    ConfigError,
    DatabaseUnavailableError,
    PayloadError,
    UnknownTaskError,
)
from .model import TaskRecord
from .registry import session_first_signature
from .retry import DEFAULT_POLICY, RetryPolicy
from .store import Store, task_store

TaskFunc = Callable[..., Awaitable[Any] | Any]
SyncAttempt = Callable[[Any, Any, Callable[[], dict[str, Any]], Any], "bool | None"]
"""`attempt(item, ack_statement, ack_params, fence)`: see `TaskRegistry.add`."""
RESERVED = ("idempotency_key", "run_at", "delay")
"""Keyword names `enqueue` keeps for itself; a task function may not take them."""

_RESERVED = frozenset(RESERVED)


def _without_reserved(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in _RESERVED}


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$")
_QUEUE = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


def check_json(value: Any, path: str) -> None:
    """Raise PayloadError naming `path` unless `value` is plain JSON (no NaN, no tuples)."""
    if value is None or isinstance(value, (bool, str, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{path} is {value!r}, which JSON cannot represent")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_json(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(f"{path} has a key {key!r} that is not a str (JSON keys are)")
            check_json(item, f"{path}[{key!r}]")
        return
    raise PayloadError(
        f"{path} is a {type(value).__name__} ({value!r:.60}), not JSON: pass str, int, float, "
        "bool, None, lists or dicts (e.g. an ISO string for a datetime, an id for a model)"
    )


class Task:
    """A registered task: call `enqueue(db, **kwargs)` to run it once, in the background."""

    def __init__(
        self,
        func: TaskFunc,
        *,
        name: str,
        retry: RetryPolicy,
        queue: str,
        timeout: float | None,
        attempt: SyncAttempt | None = None,
    ) -> None:
        self.func = func
        self.name = name
        self.retry = retry
        self.queue = queue
        self.timeout = timeout
        self.attempt = attempt
        """How the worker runs one attempt in its thread, when not on oncely's own session
        (a framework's transaction: Django's), else None."""
        self.is_async = attempt is None and inspect.iscoroutinefunction(func)
        self._signature = inspect.signature(func)
        self._bindable: set[frozenset[str]] = set()
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue} retry={self.retry!r}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function directly (no queue, no transaction handling): for unit tests."""
        return self.func(*args, **kwargs)

    # -- enqueueing ---------------------------------------------------------------------

    def entry(
        self,
        kwargs: Mapping[str, Any],
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
    ) -> dict[str, Any]:
        """Validate one enqueue's arguments; the row to insert (as plain data)."""
        args = dict(kwargs)
        for name, value in args.items():
            check_json(value, f"task {self.name!r}: argument {name!r}")
        names = frozenset(args)
        try:
            if names not in self._bindable:  # checked once per set of argument names
                self._signature.bind(None, **args)
                self._bindable.add(names)
        except TypeError as exc:
            raise PayloadError(
                f"task {self.name!r} cannot take these arguments: {exc} "
                f"(its signature is {self.name}{self._signature})"
            ) from None
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= 255
        ):
            raise BadInputError(
                f"task {self.name!r}: idempotency_key must be a str of 1-255 characters, "
                f"got {idempotency_key!r}"
            )
        if run_at is not None and delay is not None:
            raise BadInputError(f"task {self.name!r}: pass run_at or delay, not both")
        if run_at is not None and (
            not isinstance(run_at, datetime) or run_at.tzinfo is None or run_at.utcoffset() is None
        ):
            raise BadInputError(
                f"task {self.name!r}: run_at must be a timezone-aware datetime, got {run_at!r}"
            )
        seconds: float | None = None
        if delay is not None:
            if isinstance(delay, timedelta):
                seconds = delay.total_seconds()
            elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
                seconds = float(delay)
            if seconds is None or not math.isfinite(seconds) or seconds < 0:
                raise BadInputError(
                    f"task {self.name!r}: delay must be >= 0 seconds (or a timedelta), "
                    f"got {delay!r}"
                )
        return {
            "task": self.name,
            "queue": self.queue,
            "args": args,
            "idempotency_key": idempotency_key,
            "run_at": run_at,
            "delay": seconds,
        }

    def _entries(self, items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        entries = []
        for item in items:
            if type(item) is not dict and not isinstance(item, Mapping):
                raise PayloadError(f"task {self.name!r}: enqueue_many takes dicts, got {item!r}")
            kwargs = item if _RESERVED.isdisjoint(item) else _without_reserved(item)
            entries.append(
                self.entry(
                    kwargs,
                    idempotency_key=item.get("idempotency_key"),
                    run_at=item.get("run_at"),
                    delay=item.get("delay"),
                )
            )
        return entries

    async def enqueue(
        self,
        db: AsyncSession | Any,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        **kwargs: Any,
    ) -> TaskRecord:
        """Queue one run in `db`'s transaction: it exists iff that transaction commits.

        `db` is an AsyncSession, or a bare asyncpg connection (one prepared INSERT, nothing
        of SQLAlchemy in between; inside `async with conn.transaction():` it commits with
        your work, outside one it commits by itself).

        With an `idempotency_key` this task already has (in any state), nothing is inserted
        and the existing task comes back with `duplicate=True`.
        """
        entry = self.entry(kwargs, idempotency_key, run_at, delay)
        (rec,) = await task_store.enqueue(db, [entry])
        _report([rec])
        return rec

    async def enqueue_many(
        self, db: AsyncSession | Any, items: Sequence[Mapping[str, Any]]
    ) -> list[TaskRecord]:
        """Queue many runs with one INSERT; each item is the kwargs of one run, plus optional
        `idempotency_key`, `run_at` or `delay`. The records come back in the items' order.
        `db` is an AsyncSession or a bare asyncpg connection, as for `enqueue`."""
        entries = self._entries(items)
        if not entries:
            return []
        records = await task_store.enqueue(db, entries)
        _report(records)
        return records

    async def enqueue_committed(
        self,
        store: Store,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        **kwargs: Any,
    ) -> TaskRecord:
        """Queue one run in a transaction of its own, committed on return: for a producer
        with no transaction to join (the CLI, a test). DatabaseUnavailableError if the
        connection was lost during COMMIT and the task did not land, or cannot be read back
        (see `enqueue_read_back` to tell the two apart)."""
        rec, landed = await self.enqueue_read_back(
            store, idempotency_key=idempotency_key, run_at=run_at, delay=delay, **kwargs
        )
        if landed is None:
            raise DatabaseUnavailableError(
                f"the connection was lost during COMMIT of {rec.task} id {rec.id} and the task "
                "could not be read back: it may or may not be queued"
            )
        if not landed:
            raise DatabaseUnavailableError(
                f"the connection was lost during COMMIT and task {rec.task} id {rec.id} is not "
                "in the database: it rolled back, nothing was enqueued"
            )
        return rec

    async def enqueue_read_back(
        self,
        store: Store,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        **kwargs: Any,
    ) -> tuple[TaskRecord, bool | None]:
        """`enqueue_committed`, and whether the task committed: True; after a connection lost
        during COMMIT, False (it rolled back) or None (it cannot be read back: unknown)."""
        entry = self.entry(kwargs, idempotency_key, run_at, delay)
        (rec,), landed = await store.enqueue([entry])
        if landed:
            _report([rec])
        return rec, landed

    def enqueue_sync(
        self,
        session: Session,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        **kwargs: Any,
    ) -> TaskRecord:
        """`enqueue` for a synchronous SQLAlchemy Session (Django, Flask, scripts)."""
        entry = self.entry(kwargs, idempotency_key, run_at, delay)
        (rec,) = task_store.enqueue_sync(session, [entry])
        _report([rec])
        return rec


def _report(records: Sequence[TaskRecord]) -> None:
    for rec in records:
        if rec.duplicate:
            events.emit(
                "task.duplicate",
                "already enqueued, skipping",
                task=rec.task,
                id=rec.id,
                idempotency_key=rec.idempotency_key,
                state=rec.state.value,
            )
        else:
            events.emit(
                "task.enqueued",
                "enqueued",
                level=logging.DEBUG,
                task=rec.task,
                id=rec.id,
                queue=rec.queue,
                idempotency_key=rec.idempotency_key,
            )


def _check_function(name: str, func: Any) -> None:
    if not callable(func):
        raise ConfigError(f"task {name!r}: {func!r} is not callable")
    sig = session_first_signature(
        func, f"task {name!r}", "the function must take the session first, as f(db, **kwargs)"
    )
    for param in list(sig.parameters.values())[1:]:
        if param.name in RESERVED:
            raise ConfigError(
                f"task {name!r}: argument {param.name!r} is reserved by enqueue() "
                f"(reserved: {', '.join(RESERVED)})"
            )
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ConfigError(f"task {name!r}: argument {param.name!r} must accept a keyword")


class TaskRegistry:
    """The tasks an app knows, by name; validated at registration (import time)."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def add(
        self,
        func: TaskFunc,
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        queue: str = "default",
        timeout: float | timedelta | None = None,
        attempt: SyncAttempt | None = None,
    ) -> Task:
        """Validate and register a task; ConfigError naming the task if anything is off.

        `attempt` (for integrations): run each attempt with `attempt(item, ack_statement,
        ack_params, fence)` in a worker thread instead of calling `func(db, **args)` on
        oncely's session. It must run the task and the ack (`ack_statement` with the
        parameters `ack_params()` returns, called at the ack: a compare-and-set that matches
        one row iff the lease is still held) in
        one transaction of its own, commit only while holding `fence.lock` with
        `fence.closed` false, and return True (committed), False (the ack matched no row:
        rolled back) or raise the task's error (rolled back)."""
        task_name = name or getattr(func, "__name__", "")
        if not isinstance(task_name, str) or not _NAME.match(task_name):
            raise ConfigError(
                f"task name {task_name!r} is not valid: use letters, digits, _ . : - "
                "(at most 200, starting with a letter or _)"
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(f"task {task_name!r}: retry= must be a RetryPolicy, got {retry!r}")
        if not isinstance(queue, str) or not _QUEUE.match(queue):
            raise ConfigError(f"task {task_name!r}: queue {queue!r} is not a valid queue name")
        seconds: float | None = None
        if timeout is not None:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0:
                raise ConfigError(f"task {task_name!r}: timeout must be > 0 seconds")
        if attempt is None:
            _check_function(task_name, func)
        if task_name in self._tasks:
            raise ConfigError(f"task {task_name!r} is registered twice")
        task = Task(
            func,
            name=task_name,
            retry=retry or DEFAULT_POLICY,
            queue=queue,
            timeout=None if seconds is None else float(seconds),
            attempt=attempt,
        )
        self._tasks[task_name] = task
        return task

    def get(self, name: str) -> Task:
        """The task registered under `name`; UnknownTaskError lists the known ones."""
        try:
            return self._tasks[name]
        except KeyError:
            known = ", ".join(sorted(self._tasks)) or "none registered"
            raise UnknownTaskError(f"unknown task {name!r} (known tasks: {known})") from None

    def find(self, name: str) -> Task | None:
        """The task registered under `name`, or None."""
        return self._tasks.get(name)

    def __iter__(self) -> Iterator[Task]:
        return iter(sorted(self._tasks.values(), key=lambda t: t.name))

    def __len__(self) -> int:
        return len(self._tasks)


report_enqueued = _report
"""The events of an enqueue's records (`task.enqueued`, `task.duplicate`), for producers
outside this module (Django's task backend)."""
