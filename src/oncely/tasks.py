"""Task definitions and enqueueing, in the caller's own transaction.

`@app.task(...)` turns `async def f(db, **kwargs)` (or a plain `def`) into a `Task`; its
`enqueue(db, **kwargs)` inserts one row in the transaction `db` is in, so the task exists iff
that transaction commits. Arguments are JSON only, checked here, before any SQL: anything else
raises PayloadError naming the argument. An idempotency key is unique per task among all
retained tasks; enqueueing it again creates nothing and returns the existing task.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from . import events, tracing
from .errors import (
    BadInputError,
    ConfigError,
    DatabaseUnavailableError,
    PayloadError,
    ResultError,
    UnknownTaskError,
)
from .model import TaskRecord
from .registry import session_first_signature
from .retry import DEFAULT_POLICY, RetryPolicy
from .store import Store, enqueue_in, enqueue_in_sync

TaskFunc = Callable[..., Awaitable[Any] | Any]
AckFor = Callable[[Any], tuple[Any, dict[str, Any]]]
"""`ack(value) -> (statement, parameters)`: the ack of a leased task that returned `value`."""
SyncAttempt = Callable[[Any, AckFor, Any], "bool | None"]
"""`attempt(item, ack, fence)`: see `TaskRegistry.add`."""
KeyFunc = Callable[..., Any]
"""A limit's key: called with the task's keyword arguments at enqueue; a str (or an int)."""
RESERVED = ("idempotency_key", "run_at", "at", "delay", "priority")
"""Keyword names `enqueue` keeps for itself; a task function may not take them."""

_RESERVED = frozenset(RESERVED)


def _without_reserved(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in _RESERVED}


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$")
_QUEUE = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


# What no database stores as text: Postgres refuses a NUL (with a raw two-line DETAIL), SQLite
# stores it and a lone surrogate, and the task then fails every attempt.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def check_text(value: str, path: str) -> None:
    """Raise PayloadError naming `path` if `value` holds a NUL or a lone surrogate."""
    found = _UNSTORABLE.search(value)
    if found is not None:
        what = "a NUL character" if found.group() == "\x00" else "a lone surrogate"
        raise PayloadError(f"{path} ({value!r:.60}) contains {what}, which no database stores")


def check_json(value: Any, path: str) -> None:
    """Raise PayloadError naming `path` unless `value` is plain JSON (no NaN, no tuples) that
    a database can store (no NUL, no lone surrogate in a string or a key)."""
    if isinstance(value, str):
        check_text(value, path)
        return
    if value is None or isinstance(value, (bool, int)):
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
            check_text(key, f"{path}: its key")
            check_json(item, f"{path}[{key!r}]")
        return
    raise PayloadError(
        f"{path} is a {type(value).__name__} ({value!r:.60}), not JSON: pass str, int, float, "
        "bool, None, lists or dicts (e.g. an ISO string for a datetime, an id for a model)"
    )


DEFAULT_MAX_RESULT = 64 * 1024
"""Bytes: the largest return value (as JSON, UTF-8) a task may store, unless it says otherwise."""

_RATE = re.compile(
    r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(s|sec|second|m|min|minute|h|hour|d|day)s?\s*$"
)
_PERIODS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60}
_PERIODS |= {"h": 3600, "hour": 3600, "d": 86400, "day": 86400}
_PRIORITY = range(-(2**31), 2**31)


def parse_rate(rate: object, where: str) -> tuple[int, float]:
    """`"100/s"`, `"1000/min"`, `"5/10s"`, `"20/h"`: (starts, period in seconds); ConfigError
    naming `where` otherwise."""
    match = _RATE.match(rate) if isinstance(rate, str) else None
    if match is None:
        raise ConfigError(
            f"{where}: rate {rate!r} is not a rate: use N/unit, e.g. '100/s', '1000/min', "
            "'5/10s', '20/h' (units s, min, h, day)"
        )
    count, every, unit = match.groups()
    period = float(every or 1) * _PERIODS[unit]
    if int(count) < 1 or period <= 0 or int(count) >= 2**31:
        raise ConfigError(f"{where}: rate {rate!r} must allow at least 1 start in over 0 s")
    return int(count), period


def encode_result(value: Any, task: str, limit: int = DEFAULT_MAX_RESULT) -> str | None:
    """A task's return value as the JSON text stored with its success (None: nothing to store).

    ResultError if it is not JSON or its JSON is over `limit` bytes: the attempt then fails
    (its work rolls back) with that error, and its retry policy decides what next. Pure: the
    worker calls it before the ack, inside the attempt.
    """
    if value is None:
        return None
    try:
        check_json(value, f"task {task!r}: its return value")
    except PayloadError as exc:
        raise ResultError(f"{exc}; return JSON (or None) from a task") from None
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    size = len(text.encode())
    if size > limit:
        raise ResultError(
            f"task {task!r}: its return value is {size} bytes of JSON, over its limit of "
            f"{limit} (raise it with @app.task(max_result=...), or store large data in a "
            "table of your own and return its id)"
        )
    return text


def decode_result(text: str | None) -> Any:
    """The value `encode_result` stored."""
    return None if text is None else json.loads(text)


@dataclass(frozen=True)
class Limits:
    """A task's registration options that its rows carry: lease order and limits."""

    priority: int = 0
    concurrency: int | None = None
    concurrency_key: KeyFunc | None = None
    rate: tuple[int, float] | None = None
    rate_key: KeyFunc | None = None
    max_result: int = DEFAULT_MAX_RESULT


def _call_key(func: KeyFunc | None, option: str, task: str, args: dict[str, Any]) -> str:
    if func is None:
        return ""  # the limit is the task's own: one group for all its runs
    try:
        key = func(**args)
    except Exception as exc:
        raise BadInputError(
            f"task {task!r}: its {option} raised {type(exc).__name__}: {exc} "
            f"(for arguments {sorted(args)}); nothing was enqueued"
        ) from exc
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not isinstance(key, str) or not 0 < len(key) <= 255:
        raise BadInputError(
            f"task {task!r}: its {option} must return a str of 1-255 characters (or an int), "
            f"got {key!r}; nothing was enqueued"
        )
    return key


def _check_priority(priority: object, where: str, error: type[Exception]) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int) or priority not in _PRIORITY:
        raise error(f"{where}: priority must be an int (32-bit), got {priority!r}")
    return priority


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
        limits: Limits | None = None,
        attempt: SyncAttempt | None = None,
    ) -> None:
        self.func = func
        self.limits = limits or Limits()
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

    def unbound(self, args: Mapping[str, Any]) -> tuple[str, str] | None:
        """Why this release's function cannot take `args` (a task enqueued by another
        release): (what a worker that can needs, e.g. "accepts `currency`"; Python's
        message), or None if they bind. Checked once per set of argument names. A task an
        integration runs (`attempt`: Django's) keeps its call in its own shape: not checked."""
        if self.attempt is not None:
            return None
        names = frozenset(args)
        if names in self._bindable:
            return None
        try:
            self._signature.bind(None, **args)
        except TypeError as exc:
            return self._wants(names), str(exc)
        self._bindable.add(names)
        return None

    def _wants(self, names: frozenset[str]) -> str:
        params = list(self._signature.parameters.values())[1:]  # after the session
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        named = {p.name for p in params if p.kind in kinds}
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            unknown = sorted(names - named)
            if unknown:
                return "accepts " + ", ".join(f"`{n}`" for n in unknown)
        empty = inspect.Parameter.empty
        missing = sorted(p.name for p in params if p.kind in kinds and p.default is empty)
        missing = [n for n in missing if n not in names]
        if missing:
            return "does not require " + ", ".join(f"`{n}`" for n in missing)
        return "takes these arguments"

    # -- enqueueing ---------------------------------------------------------------------

    def entry(
        self,
        kwargs: Mapping[str, Any],
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        at: datetime | None = None,
    ) -> dict[str, Any]:
        """Validate one enqueue's arguments; the row to insert (as plain data). `at` is
        `run_at` under its short name (one of the two, or `delay`)."""
        args = dict(kwargs)
        for name, value in args.items():
            check_text(name, f"task {self.name!r}: an argument's name")
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
        if idempotency_key is not None:
            check_text(idempotency_key, f"task {self.name!r}: idempotency_key")
        run_at, seconds = self._when(run_at, at, delay)
        entry = {
            "task": self.name,
            "queue": self.queue,
            "args": args,
            "idempotency_key": idempotency_key,
            "run_at": run_at,
            "delay": seconds,
        }
        self._limit(entry, args, priority)
        return entry

    def _when(
        self, run_at: datetime | None, at: datetime | None, delay: float | timedelta | None
    ) -> tuple[datetime | None, float | None]:
        """An enqueue's wait, checked: (run_at, delay in seconds), at most one of the two."""
        when = "run_at"
        if at is not None:
            if run_at is not None:
                raise BadInputError(f"task {self.name!r}: pass at or run_at (the same), not both")
            run_at, when = at, "at"
        if run_at is not None and delay is not None:
            raise BadInputError(f"task {self.name!r}: pass {when} or delay, not both")
        if run_at is not None and (
            not isinstance(run_at, datetime) or run_at.tzinfo is None or run_at.utcoffset() is None
        ):
            raise BadInputError(
                f"task {self.name!r}: {when} must be a timezone-aware datetime (e.g. "
                f"datetime.now(timezone.utc) + timedelta(hours=1)), got {run_at!r}"
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
        return run_at, seconds

    def _limit(self, entry: dict[str, Any], args: dict[str, Any], priority: int | None) -> None:
        """Add the row's priority and limits (its groups' keys from the key functions)."""
        limits = self.limits
        if priority is not None:
            entry["priority"] = _check_priority(priority, f"task {self.name!r}", BadInputError)
        elif limits.priority:
            entry["priority"] = limits.priority
        if limits.concurrency is not None:
            entry["concurrency"] = limits.concurrency
            entry["concurrency_key"] = _call_key(
                limits.concurrency_key, "concurrency_key", self.name, args
            )
        if limits.rate is not None:
            entry["rate"], entry["rate_period"] = limits.rate
            entry["rate_key"] = _call_key(limits.rate_key, "rate_key", self.name, args)

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
                    priority=item.get("priority"),
                    at=item.get("at"),
                )
            )
        return entries

    async def enqueue(
        self,
        db: AsyncSession | Any,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> TaskRecord:
        """Queue one run in `db`'s transaction: it exists iff that transaction commits.

        `db` is an AsyncSession, or a bare asyncpg connection (one prepared INSERT, nothing
        of SQLAlchemy in between; inside `async with conn.transaction():` it commits with
        your work, outside one it commits by itself).

        With an `idempotency_key` this task already has (in any state), nothing is inserted
        and the existing task comes back with `duplicate=True`. `priority` (default: the
        task's) puts it before due tasks of lower priority. `at` (or `run_at`: a
        timezone-aware datetime) or `delay` (seconds or a timedelta) make it wait: no
        worker leases it before then, by the database's clock.
        """
        entry = self.entry(kwargs, idempotency_key, run_at, delay, priority, at)
        with tracing.enqueuing(self.name, self.queue, [entry]) as span:
            (rec,) = await enqueue_in(db, [entry])
            _report([rec], span)
        return rec

    async def enqueue_many(
        self, db: AsyncSession | Any, items: Sequence[Mapping[str, Any]]
    ) -> list[TaskRecord]:
        """Queue many runs with one INSERT; each item is the kwargs of one run, plus optional
        `idempotency_key`, `run_at` (or `at`), `delay` or `priority`. The records come back
        in the items' order. `db` is an AsyncSession or a bare asyncpg connection, as for
        `enqueue`."""
        entries = self._entries(items)
        if not entries:
            return []
        with tracing.enqueuing(self.name, self.queue, entries) as span:
            records = await enqueue_in(db, entries)
            _report(records, span)
        return records

    async def enqueue_committed(
        self,
        store: Store,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> TaskRecord:
        """Queue one run in a transaction of its own, committed on return: for a producer
        with no transaction to join (the CLI, a test). DatabaseUnavailableError if the
        connection was lost during COMMIT and the task did not land, or cannot be read back
        (see `enqueue_read_back` to tell the two apart)."""
        rec, landed = await self.enqueue_read_back(
            store,
            idempotency_key=idempotency_key,
            run_at=run_at,
            at=at,
            delay=delay,
            priority=priority,
            **kwargs,
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
        at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> tuple[TaskRecord, bool | None]:
        """`enqueue_committed`, and whether the task committed: True; after a connection lost
        during COMMIT, False (it rolled back) or None (it cannot be read back: unknown)."""
        entry = self.entry(kwargs, idempotency_key, run_at, delay, priority, at)
        with tracing.enqueuing(self.name, self.queue, [entry]) as span:
            (rec,), landed = await store.enqueue([entry])
            if landed:
                _report([rec], span)
        return rec, landed

    def enqueue_sync(
        self,
        session: Session,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> TaskRecord:
        """`enqueue` for a synchronous SQLAlchemy Session (Django, Flask, scripts)."""
        entry = self.entry(kwargs, idempotency_key, run_at, delay, priority, at)
        with tracing.enqueuing(self.name, self.queue, [entry]) as span:
            (rec,) = enqueue_in_sync(session, [entry])
            _report([rec], span)
        return rec


def _report(records: Sequence[TaskRecord], span: tracing.Span | None = None) -> None:
    tracing.enqueued(span, records)
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


def _check_key(func: object, option: str, where: str, needs: str, limit: object) -> None:
    if func is None:
        return
    if limit is None:
        raise ConfigError(f"{where}: {option}= needs {needs}= (the limit its key groups by)")
    if not callable(func):
        raise ConfigError(f"{where}: {option}= must be a function of the task's arguments")


def check_limits(
    name: str,
    *,
    priority: object = 0,
    concurrency: object = None,
    concurrency_key: object = None,
    rate: object = None,
    rate_key: object = None,
    max_result: object = DEFAULT_MAX_RESULT,
) -> Limits:
    """`@app.task`'s limit options, checked at registration; ConfigError naming the task."""
    where = f"task {name!r}"
    if concurrency is not None and (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 0 < concurrency < 2**31
    ):
        raise ConfigError(f"{where}: concurrency must be an int >= 1, got {concurrency!r}")
    _check_key(concurrency_key, "concurrency_key", where, "concurrency", concurrency)
    _check_key(rate_key, "rate_key", where, "rate", rate)
    if (
        isinstance(max_result, bool)
        or not isinstance(max_result, int)
        or not 0 < max_result < 2**31
    ):
        raise ConfigError(f"{where}: max_result must be a number of bytes >= 1, got {max_result!r}")
    return Limits(
        priority=_check_priority(priority, where, ConfigError),
        concurrency=concurrency,
        concurrency_key=concurrency_key,  # type: ignore[arg-type]
        rate=parse_rate(rate, where) if rate is not None else None,
        rate_key=rate_key,  # type: ignore[arg-type]
        max_result=max_result,
    )


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
        limits: Mapping[str, Any] | None = None,
        attempt: SyncAttempt | None = None,
    ) -> Task:
        """Validate and register a task; ConfigError naming the task if anything is off.

        `limits`: `@app.task`'s priority, concurrency, concurrency_key, rate, rate_key and
        max_result (see `check_limits`).

        `attempt` (for integrations): run each attempt with `attempt(item, ack, fence)` in a
        worker thread instead of calling `func(db, **args)` on oncely's session. It must run
        the task and its ack in one transaction of its own: `ack(value)`, called at the ack
        with what the task returned, gives the ack's (statement, parameters), a
        compare-and-set that matches one row iff the lease is still held, storing `value` as
        the task's result (ResultError if it is not JSON or over `max_result`: the attempt
        then fails). It commits only while holding `fence.lock` with `fence.closed` false,
        and returns True (committed), False (the ack matched no row: rolled back) or raises
        the task's error (rolled back)."""
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
            limits=check_limits(task_name, **(limits or {})),
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
"""The events of an enqueue's records (`task.enqueued`, `task.duplicate`) and its span's
attributes, for producers outside this module (Django's task backend)."""
