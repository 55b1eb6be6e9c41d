"""`Oncely`: the one object users build; it wires the registry, the store and the runner."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from . import clock, config, events, queue
from .effects import DEFAULT_SCOPE, Effect, OnceDecorator, SyncEffect
from .errors import BadInputError, ConfigError, ResultTimeoutError, TaskFailedError
from .identity import replica_id
from .model import Claim, RunResult, RunStatus, Slot, TaskRecord, TaskState
from .queue import DEFAULT_CONCURRENCY
from .registry import JobFunc, KeyFunc, Registry
from .retry import RetryPolicy
from .runner import run_slot
from .schedule import Schedule
from .store import Store
from .tasks import DEFAULT_MAX_RESULT, Task, TaskFunc, TaskRegistry
from .worker import DEFAULT_SHUTDOWN_TIMEOUT

F = TypeVar("F", bound=JobFunc)

DEFAULT_DATABASE_URL = "sqlite:///oncely.db"
DEFAULT_LEASE = 30.0
"""Seconds: a task's lease when neither Oncely(lease=...) nor `oncely worker --lease` says."""
Database = str | AsyncEngine | async_sessionmaker  # type: ignore[type-arg]


def _database_from_env() -> str:
    return os.environ.get("ONCELY_DATABASE_URL") or DEFAULT_DATABASE_URL


class Oncely:
    """Jobs whose effects happen once, on one database.

    `database` is a URL (`postgresql://…`, `sqlite:///…`), an AsyncEngine, or an
    async_sessionmaker; by default `$ONCELY_DATABASE_URL`, else the SQLite file `oncely.db`
    in the working directory. Nothing connects until the first call that needs the database.
    """

    def __init__(self, database: Database | None = None, *, lease: float = DEFAULT_LEASE) -> None:
        self.registry = Registry()
        self.tasks = TaskRegistry()
        if (
            not isinstance(lease, (int, float))
            or isinstance(lease, bool)
            or not math.isfinite(lease)
            or lease <= 0
        ):
            raise ConfigError(f"Oncely(lease=...) must be > 0 seconds, got {lease!r}")
        self.lease = float(lease)
        """Seconds a worker holds a task before another may take it over (heartbeats renew)."""
        self._database: Database = database if database is not None else _database_from_env()
        self._store: Store | None = None

    # -- configuration ------------------------------------------------------------------

    def use_database(self, database: Database) -> None:
        """Point the app at another database (e.g. the CLI's --database-url); before first use."""
        if self._store is not None:
            raise ConfigError("use_database() must be called before the app touches the database")
        self._database = database

    @property
    def store(self) -> Store:
        """The app's store, built on first use."""
        if self._store is None:
            self._store = _build_store(self._database)
        return self._store

    def job(
        self,
        schedule: Schedule,
        *,
        name: str | None = None,
        key: KeyFunc | None = None,
        catch_up: str = "latest",
        grace: timedelta | None = None,
        overlap: str = "skip",
    ) -> Callable[[F], F]:
        """Register `f(db, now)` to run once per slot of `schedule`.

        `db` is an AsyncSession (a Session for a plain `def`) in an open transaction that
        also holds the slot's claim; `now` is the slot's nominal time in the schedule's zone.
        The job never commits: returning commits, raising rolls back and frees the slot.
        `catch_up`, `grace` and `overlap` tell the worker what to do with missed and
        overlapping slots (see docs/worker.md).
        """

        def register(func: F) -> F:
            self.registry.add_job(
                schedule, func, name=name, key=key, catch_up=catch_up, grace=grace, overlap=overlap
            )
            return func

        return register

    def task(
        self,
        func: TaskFunc | None = None,
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        queue: str = "default",
        timeout: float | timedelta | None = None,
        priority: int = 0,
        concurrency: int | None = None,
        concurrency_key: Callable[..., Any] | None = None,
        rate: str | None = None,
        rate_key: Callable[..., Any] | None = None,
        max_result: int = DEFAULT_MAX_RESULT,
    ) -> Any:
        """Register `f(db, **kwargs)` as a task; `await f.enqueue(db, **kwargs)` queues a run.

        The run gets `db` (an AsyncSession, or a Session for a plain `def`) in a transaction
        that also marks the task succeeded: returning commits both (with the return value,
        JSON of at most `max_result` bytes), raising rolls both back and `retry` (default:
        25 attempts, attempt**4 + 15 s +/-10 %) decides what next.

        Leasing, in the database: higher `priority` first; at most `concurrency` attempts at
        once per `concurrency_key(**kwargs)` (or for the whole task), at most `rate` starts
        (`"100/s"`, `"1000/min"`) per `rate_key(**kwargs)`; tasks over a limit wait.
        """
        limits = {
            "priority": priority,
            "concurrency": concurrency,
            "concurrency_key": concurrency_key,
            "rate": rate,
            "rate_key": rate_key,
            "max_result": max_result,
        }

        def register(f: TaskFunc) -> Task:
            return self.tasks.add(
                f, name=name, retry=retry, queue=queue, timeout=timeout, limits=limits
            )

        return register(func) if func is not None else register

    # -- slots --------------------------------------------------------------------------

    def slot(self, job: str, now: datetime | None = None) -> Slot:
        """The slot a run at `now` (default: the current time) belongs to: the latest due one."""
        definition = self.registry.job(job)
        at = _aware(now) if now is not None else clock.utcnow()
        slot = definition.schedule.latest_at_or_before(at)
        if slot is None:
            raise BadInputError(f"job {job!r} has no slot at or before {at.isoformat()}")
        return Slot(job=definition.name, key=definition.key_for(slot), at=slot)

    def next_slots(self, job: str, after: datetime | None = None, n: int = 1) -> list[datetime]:
        """The next `n` slot times of a job strictly after `after` (default: now)."""
        definition = self.registry.job(job)
        start = _aware(after) if after is not None else clock.utcnow()
        slots: list[datetime] = []
        for slot in definition.schedule.slots_after(start):
            if len(slots) >= n:
                break
            slots.append(slot)
        return slots

    # -- running ------------------------------------------------------------------------

    async def attempt(self, job: str, now: datetime | None = None) -> RunResult:
        """Run the slot due at `now` (default: the database's clock) once if nobody has; a job's
        error comes back as `failed`."""
        if now is None:
            self.registry.job(job)  # an unknown job fails before touching the database
            now = clock.utcnow() if clock.is_set() else await self.store.database_time()
        slot = self.slot(job, now)
        await self.store.ensure_schema()
        return await run_slot(self.store, self.registry.job(job), slot.at, slot.key, replica_id())

    async def run(self, job: str, now: datetime | None = None) -> RunResult:
        """Run the slot due at `now` once if nobody has; re-raise the job's error after rollback.

        Returns `ran`, `skipped` (claimed before: the job was not called) or `busy` (someone
        is running it right now: returned at once, without waiting).
        """
        result = await self.attempt(job, now)
        if result.status is RunStatus.FAILED and result.error is not None:
            raise result.error
        return result

    # -- the worker ---------------------------------------------------------------------

    async def work(
        self,
        *,
        jobs: Sequence[str] | None = None,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        stopping: asyncio.Event | None = None,
        handle_signals: bool = False,
        startup_wait: float = config.STARTUP_WAIT,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease: float | None = None,
        queues: list[str] | None = None,
        pool_size: int = config.POOL_SIZE,
    ) -> None:
        """Run the scheduled jobs (all, or `jobs`) and the tasks until `stopping` is set.

        Safe in every replica: the slot claim decides who runs each slot, leases decide who
        runs each task. On stop, running attempts get `shutdown_timeout` seconds to finish,
        then are cancelled (rolled back). With `handle_signals`, SIGTERM and SIGINT set
        `stopping` (the CLI does this). A database that is unreachable at start is waited for
        up to `startup_wait` seconds (DatabaseUnavailableError after that); once running,
        outages are retried forever. Up to `concurrency` tasks run at once (0: no tasks here),
        each in its own transaction on a pool of `pool_size` connections, leased for `lease`
        seconds (default `Oncely(lease=...)`), from `queues` (default: all).
        """
        from . import worker

        selected = [self.registry.job(name) for name in jobs] if jobs is not None else None
        await worker.serve(
            self,
            stopping or asyncio.Event(),
            jobs=selected,
            shutdown_timeout=shutdown_timeout,
            startup_wait=startup_wait,
            handle_signals=handle_signals,
            concurrency=concurrency,
            lease=lease,
            queues=queues,
            pool_size=pool_size,
        )

    @contextlib.asynccontextmanager
    async def worker(self, **options: Any) -> AsyncIterator[asyncio.Task[None]]:
        """Run the worker in the background for the block's duration (e.g. a FastAPI lifespan).

        `options` are `work()`'s (jobs, shutdown_timeout, concurrency, lease, queues …).
        Leaving the block stops it gracefully; an error that stopped it early is raised then.
        """
        stopping = asyncio.Event()
        task = asyncio.create_task(self.work(**options, stopping=stopping))
        try:
            yield task
        finally:
            stopping.set()
            await task

    # -- once-per-key effects, for any caller --------------------------------------------

    def effect(self, key: str, *, scope: str = DEFAULT_SCOPE) -> Effect:
        """`async with app.effect("charge:42") as db:` — run the block once per key.

        Opens a transaction and claims `key`; `db` is that AsyncSession, or None if the key
        was processed before (skip the work: it is logged as `effect.skipped`). The block's
        writes commit with the claim; an exception rolls both back and frees the key.
        """
        return Effect(self.store, key, scope)

    def effect_sync(self, key: str, *, scope: str = DEFAULT_SCOPE) -> SyncEffect:
        """`with app.effect_sync("charge:42") as session:` — `effect` for synchronous code."""
        return SyncEffect(self.store, key, scope)

    def once(self, key: Callable[..., str], *, scope: str = DEFAULT_SCOPE) -> OnceDecorator:
        """Make a handler `f(db, *args)` take effect once per `key(*args)`.

        Calling the handler with `*args` returns an EffectResult: `ran` (with the return
        value) or `skipped` (a duplicate: `f` was not called); an exception rolls back, frees
        the key and propagates, so the caller's queue retries.
        """
        return OnceDecorator(lambda: self.store, key, scope)

    # -- the ledger ---------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Create or upgrade oncely's tables (idempotent); the migration versions applied."""
        return await self.store.migrate()

    async def history(self, job: str | None = None, limit: int = 50) -> list[Claim]:
        """Claims newest first: who ran each slot, when, and how long it took."""
        claims = await self.store.history(job, limit)
        if job is not None and not claims and not job.startswith("@"):  # "@scope": effects
            # Unknown means neither registered nor in the ledger: a database read without the
            # app that wrote it (or a job since removed) still shows its history.
            self.registry.job(job)
        return claims

    async def last_runs(self) -> dict[str, Claim]:
        """The newest claim of each job that has one."""
        return await self.store.last_claims()

    async def release(self, job: str, key: str) -> Claim | None:
        """Delete one claim so its slot can run again (logged); the claim deleted, or None."""
        claim = await self.store.release(job, key)
        if claim is not None:
            events.emit(
                "run.released",
                "claim deleted by hand; the slot can run again",
                level=logging.WARNING,
                job=job,
                key=key,
                claimed_by=claim.claimed_by,
            )
        return claim

    # -- the task queue's operations ----------------------------------------------------

    async def list_tasks(
        self, state: TaskState | None = None, task: str | None = None, limit: int = 50
    ) -> list[TaskRecord]:
        """Tasks newest first, optionally of one state and one task name."""
        return await queue.list_tasks(self, state, task, limit)

    async def retry_task(self, task_id: int) -> TaskRecord:
        """Run a dead, discarded or waiting task again now, with a fresh set of attempts."""
        return await queue.retry_task(self, task_id)

    async def discard_task(self, task_id: int) -> TaskRecord:
        """Discard a task that has not succeeded; a running attempt of it then rolls back."""
        return await queue.discard_task(self, task_id)

    async def prune(self, older_than: timedelta) -> tuple[int, int]:
        """Delete tasks finished, and slot claims made, more than `older_than` ago (database
        time); (tasks, claims) deleted. See docs/tasks.md on how long to keep claims."""
        return await queue.prune(self, older_than)

    async def rename(self, old: str, new: str, *, force: bool = False) -> tuple[int, int]:
        """Carry a renamed job's ledger from `old` to `new` (logged), so the new name does not
        run the slots the old one ran; (claims moved, claims left under `old`)."""
        self.registry.check_name(new)
        if old == new:
            raise BadInputError(f"rename {old!r} to itself: nothing to do")
        moved, left = await self.store.rename(old, new, force=force)
        events.emit(
            "run.renamed",
            "claims carried to the job's new name",
            level=logging.WARNING,
            job=new,
            old=old,
            moved=moved,
            left=left,
        )
        return moved, left

    async def task_record(self, task_id: int) -> TaskRecord:
        """One task as it is now (its state, attempts, result); BadInputError if there is no
        such task (never enqueued, or pruned)."""
        rec = await self.store.tasks.get(task_id)
        if rec is None:
            raise BadInputError(f"no task with id {task_id} (never enqueued, or pruned)")
        return rec

    async def task_result(self, task_id: int, *, timeout: float | None = 30.0) -> Any:
        """What task `task_id` returned (None if it returned None), once it has succeeded:
        waits up to `timeout` seconds (None: as long as it takes), polling the database.

        TaskFailedError if it ended dead or discarded (its last error in the message),
        ResultTimeoutError if it is still queued or running at the deadline, BadInputError
        if there is no such task (never enqueued, or pruned with its result).
        """
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise BadInputError(f"task_result(timeout=...) must be >= 0 seconds, got {timeout!r}")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        pause = 0.02
        while True:
            rec = await self.task_record(task_id)
            if rec.state is TaskState.SUCCEEDED:
                return rec.result
            if rec.state in (TaskState.DEAD, TaskState.DISCARDED):
                error = (rec.error or "").split("\n", 1)[0] or "no error recorded"
                raise TaskFailedError(f"task {task_id} ({rec.task}) is {rec.state.value}: {error}")
            if deadline is not None and loop.time() >= deadline:
                raise ResultTimeoutError(
                    f"task {task_id} ({rec.task}) is still {rec.state.value} after {timeout} s"
                )
            wait = pause if deadline is None else min(pause, max(0.0, deadline - loop.time()))
            await asyncio.sleep(wait)  # polling the row, with a deadline
            pause = min(pause * 2, 0.5)

    async def aclose(self) -> None:
        """Release the connection pool oncely opened (a user's engine stays open)."""
        if self._store is not None:
            await self._store.dispose()


def _aware(t: datetime) -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise BadInputError(f"time {t.isoformat()} has no UTC offset; pass a timezone-aware time")
    return t


def _build_store(database: Database) -> Store:
    if isinstance(database, str):
        return Store.from_url(database)
    if isinstance(database, AsyncEngine):
        return Store(database, owns_engine=False)
    if isinstance(database, async_sessionmaker):
        bind = database.kw.get("bind")
        if isinstance(bind, AsyncEngine):
            return Store(bind, owns_engine=False)
        raise ConfigError("the async_sessionmaker passed to Oncely() has no AsyncEngine bind")
    raise ConfigError(
        f"Oncely() takes a database URL, an AsyncEngine or an async_sessionmaker, "
        f"not {type(database).__name__}"
    )
