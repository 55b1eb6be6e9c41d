"""`Oncely`: the one object users build; it wires the registry, the store and the runner."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from . import clock, config, events
from .effects import DEFAULT_SCOPE, Effect, OnceDecorator, SyncEffect
from .errors import (
    BadInputError,
    ConfigError,
    OncelyError,
    ResultTimeoutError,
    ScheduleError,
    TaskFailedError,
    UnknownJobError,
)
from .explain import explain_slot, explain_task, span
from .fates import (
    LEEWAY,
    JobLedger,
    JobVerdict,
    Verdict,
    no_worker_findings,
    unrunnable_findings,
    verify_job,
)
from .identity import default_actor, replica_id
from .model import (
    Attempt,
    AuditEntry,
    Claim,
    Explanation,
    Pause,
    PlannedSlot,
    Renamed,
    RunResult,
    RunStatus,
    ScheduleRecord,
    Slot,
    TaskHistory,
    TaskRecord,
    TaskState,
)
from .registry import Job, JobFunc, KeyFunc, Registry, key_problem, schedule_given
from .retry import RetryPolicy
from .runner import LISTEN_AFTER, run_slot
from .schedule import Schedule, default_key
from .schedules import Schedules, job_for, schedule_name
from .store import ERRORS_SHOWN, Action, Store
from .tasks import DEFAULT_MAX_RESULT, Task, TaskFunc, TaskRegistry
from .work import supervisor
from .work.options import WorkerOptions
from .work.tasks import ANNOUNCE_EVERY, TaskWorker

F = TypeVar("F", bound=JobFunc)

DEFAULT_DATABASE_URL = "sqlite:///oncely.db"
DEFAULT_MAX_SLOTS = config.MAX_SLOTS
"""A backfill of more slots than this is refused before anything runs (`--max-slots`)."""
BACKFILL_PATIENCE = 60.0
"""Seconds a backfill keeps trying a slot that is busy (or waits for another slot of its job,
overlap="skip") before it reports it as such and moves on."""
VERIFY_WINDOW = timedelta(hours=24)
"""How far back `verify` looks by default (or to the job's first appearance, if later)."""
VERIFY_MAX_SLOTS = 100_000
"""A verify window holding more slots of one job than this is refused: narrow it."""
CANCEL_RECORD_WAIT = LISTEN_AFTER + 2.0
"""Seconds `cancel` waits for the start record of an attempt that holds its lock but has not
recorded its start yet (it does so once it has run `runner.LISTEN_AFTER`)."""
DEFAULT_LEASE = config.LEASE
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
        self.schedules = Schedules(lambda: self.store, self.registry, self.tasks)
        self._data_jobs: dict[str, Job] = {}
        """The jobs of schedules kept as data this app has read, by ledger name."""
        """Schedules kept as data: add, change, pause and remove them at runtime."""

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
        timeout: timedelta | None = None,
        retry: RetryPolicy | None = None,
    ) -> Callable[[F], F]:
        """Register `f(db, now)` to run once per slot of `schedule`.

        `db` is an AsyncSession (a Session for a plain `def`) in an open transaction that
        also holds the slot's claim; `now` is the slot's nominal time in the schedule's zone.
        The job never commits: returning commits; raising rolls its work back and records
        the slot as given up, unless `retry` (a RetryPolicy, its attempts counted across the
        fleet) runs it again later. `catch_up`, `grace` and `overlap` tell the worker what to
        do with missed and overlapping slots (see docs/worker.md). An attempt running longer
        than `timeout` is cancelled and rolled back, and given up as a failure is (see
        docs/operate.md). A bare `@app.job` (no schedule) raises ConfigError at import.
        """
        schedule_given(schedule)

        def register(func: F) -> F:
            self.registry.add_job(
                schedule,
                func,
                name=name,
                key=key,
                catch_up=catch_up,
                grace=grace,
                overlap=overlap,
                timeout=timeout,
                retry=retry,
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

    # -- jobs and schedules kept as data -------------------------------------------------

    def _definition(self, job: str) -> Job:
        """The job named `job`: a code job, or a schedule kept as data that `_resolve` read."""
        try:
            return self.registry.job(job)
        except UnknownJobError:
            found = self._data_jobs.get(job)
            if found is None:
                raise
            return found

    async def resolve(self, job: str) -> str:
        """The name the slots of `job` are claimed under: a code job's own name; for a
        schedule kept as data (named bare or by its ledger name, `schedule:<name>`) its
        ledger name, its job then known to this app's calls (`slot`, `explain`, …). Any
        other name is left as it is (the registry then says it is unknown)."""
        if job in {j.name for j in self.registry}:
            return job
        record = await self._schedule(job)
        if record is None:
            return job
        self._data_jobs[record.ledger_name] = job_for(
            record, self.registry, self.tasks, strict=False
        )
        return record.ledger_name

    async def _schedule(self, job: str) -> ScheduleRecord | None:
        """The schedule kept as data that `job` names (bare or by ledger name), if any."""
        name = schedule_name(job) or job
        try:
            return await self.schedules.get(name)
        except ScheduleError:
            return None
        except OncelyError:  # no such table yet, unreachable: the name is not known here
            if schedule_name(job) is None:
                return None
            raise

    @property
    def data_jobs(self) -> dict[str, Job]:
        """The jobs of the schedules kept as data this app has read (`resolve`), by ledger name."""
        return self._data_jobs

    @property
    def registry_names(self) -> set[str]:
        """The names of the jobs in the code."""
        return {j.name for j in self.registry}

    # -- slots --------------------------------------------------------------------------

    def slot(self, job: str, now: datetime | None = None) -> Slot:
        """The slot a run at `now` (default: the current time) belongs to: the latest due one."""
        definition = self._definition(job)
        at = _aware(now) if now is not None else clock.utcnow()
        slot = definition.schedule.latest_at_or_before(at)
        if slot is None:
            raise BadInputError(f"job {job!r} has no slot at or before {at.isoformat()}")
        return Slot(job=definition.name, key=definition.key_for(slot), at=slot)

    def next_slots(self, job: str, after: datetime | None = None, n: int = 1) -> list[datetime]:
        """The next `n` slot times of a job strictly after `after` (default: now)."""
        definition = self._definition(job)
        start = _aware(after) if after is not None else clock.utcnow()
        slots: list[datetime] = []
        for slot in definition.schedule.slots_after(start):
            if len(slots) >= n:
                break
            slots.append(slot)
        return slots

    # -- running ------------------------------------------------------------------------

    async def attempt(
        self, job: str, now: datetime | None = None, *, allow_future: bool = False
    ) -> RunResult:
        """Run the slot due at `now` (default: the database's clock) once if nobody has; a job's
        error comes back as `failed`. This is the caller's retry: a slot waiting for its retry
        policy runs at once (its budget counts this attempt too); a slot whose budget is spent
        comes back `given_up` with `attempts` (`result.done` is False).

        A `now` naming a slot later than the database's clock (beyond `clock.FUTURE_SKEW`) is
        refused (BadInputError, nothing run): run early, its claim would make the real slot
        skip when it comes due. `allow_future=True` runs it on purpose (`run.future_allowed`)."""
        job = await self.resolve(job)
        if now is None:
            self._definition(job)  # an unknown job fails before touching the database
            now = clock.utcnow() if clock.is_set() else await self.store.database_time()
        else:
            await self.refuse_future(job, now, allow=allow_future)
        slot = self.slot(job, now)
        await self.store.ensure_schema()
        with contextlib.suppress(OncelyError):  # best effort: verify dates by claims too
            await self.store.control.seen_jobs([self._definition(job).name])
        return await run_slot(
            self.store,
            self._definition(job),
            slot.at,
            slot.key,
            replica_id(),
            check_pause=True,
            retry_now=True,  # the caller's retry: a slot waiting for its retry runs now
        )

    async def run(
        self, job: str, now: datetime | None = None, *, allow_future: bool = False
    ) -> RunResult:
        """Run the slot due at `now` once if nobody has; re-raise the job's error after rollback.

        Returns `ran`, `skipped` (claimed before: the job was not called), `busy` (someone
        is running it right now: returned at once, without waiting), `paused` (the job is
        paused: not started) or `given_up` (its retry budget was spent, or an operator
        skipped it: `attempts`, `skipped_by`; `result.done` says whether its work is
        accounted for). A timeout or a cancel raises JobTimeoutError or JobCancelledError
        after the rollback.
        """
        result = await self.attempt(job, now, allow_future=allow_future)
        if result.status in _RAISED and result.error is not None:
            raise result.error
        return result

    # -- the worker ---------------------------------------------------------------------

    async def work(
        self,
        *,
        jobs: Sequence[str] | None = None,
        shutdown_timeout: float = config.SHUTDOWN_TIMEOUT,
        stopping: asyncio.Event | None = None,
        handle_signals: bool = False,
        startup_wait: float = config.STARTUP_WAIT,
        concurrency: int = config.CONCURRENCY,
        lease: float | None = None,
        queues: list[str] | None = None,
        pool_size: int = config.POOL_SIZE,
        schedule_poll: float = config.SCHEDULE_POLL,
        group: int = config.GROUP,
    ) -> None:
        """Run the scheduled jobs (all, or `jobs`) and the tasks until `stopping` is set.

        Safe in every replica: the slot claim decides who runs each slot, leases decide who
        runs each task. On stop, running attempts get `shutdown_timeout` seconds to finish,
        then are cancelled (rolled back). With `handle_signals`, SIGTERM and SIGINT set
        `stopping` (the CLI does this). A database that is unreachable at start is waited for
        up to `startup_wait` seconds (DatabaseUnavailableError after that); once running,
        outages are retried forever. Up to `concurrency` tasks run at once (0: no tasks here),
        each in its own transaction on a pool of `pool_size` connections, leased for `lease`
        seconds (default `Oncely(lease=...)`), from `queues` (default: all). Without `jobs`,
        the schedules kept as data (`app.schedules`) run too: their due rows are read every
        `schedule_poll` seconds, so a change reaches this worker within that. With `group`
        above 1, a worker with a backlog runs up to that many async tasks (Postgres, no
        timeout) one after another in one transaction, a savepoint each, one COMMIT for all
        (docs/tasks.md, "Groups of tasks").
        """
        options = self._options(
            jobs=jobs,
            shutdown_timeout=shutdown_timeout,
            startup_wait=startup_wait,
            concurrency=concurrency,
            lease=lease,
            queues=queues,
            pool_size=pool_size,
            schedule_poll=schedule_poll,
            group=group,
        )
        await supervisor.serve(
            self.store,
            self.registry,
            self.tasks,
            stopping or asyncio.Event(),
            options,
            handle_signals=handle_signals,
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

    def task_worker(self, **options: Any) -> TaskWorker:
        """A task worker for this app's tasks, built from its store, its task registry and
        `options` (WorkerOptions' fields: concurrency, lease, queues, batch, poll, pool_size;
        `lease` defaults to `Oncely(lease=...)`). `consume` runs one; its `step` runs once."""
        built = self._options(**options)
        if built.concurrency < 1:
            raise BadInputError(f"concurrency must be an integer >= 1, got {built.concurrency!r}")
        return TaskWorker(self.store, self.tasks, built)

    async def consume(self, stopping: asyncio.Event, **options: Any) -> None:
        """Run this app's tasks (no jobs) until `stopping` is set and the tasks in flight ended.

        Up to `concurrency` tasks run at once, each in its own transaction on a pool of
        `pool_size` connections (taken at a task's first statement, given back at its commit);
        `lease` (default `Oncely(lease=...)`) is how long a silent worker keeps its tasks;
        `queues` limits which queues it serves (default all); `batch` caps the tasks leased in
        one statement; `poll` is the fallback wake-up interval in seconds. Cancelling the call
        rolls back the tasks in flight and hands them back at once.
        """
        await self.task_worker(**options).consume(stopping)

    def _options(self, *, lease: float | None = None, **options: Any) -> WorkerOptions:
        """A worker's options from keyword arguments; the lease defaults to the app's."""
        return WorkerOptions.of(lease=self.lease if lease is None else lease, **options)

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
        """Claims newest first: who ran each slot, when, and how long it took (a schedule kept
        as data may be named bare: its slots are claimed under `schedule:<name>`)."""
        if job is not None and not job.startswith("@"):
            job = await self.resolve(job)
        claims = await self.store.claims.history(job, limit)
        if job is not None and not claims and not job.startswith("@"):  # "@scope": effects
            # Unknown means neither registered nor in the ledger: a database read without the
            # app that wrote it (or a job since removed) still shows its history.
            self._definition(job)
        return claims

    async def last_runs(self) -> dict[str, Claim]:
        """The newest claim of each job that has one."""
        return await self.store.claims.last_claims()

    async def release(
        self,
        job: str,
        key: str,
        *,
        force: bool = False,
        actor: str | None = None,
        reason: str | None = None,
    ) -> Claim | None:
        """Delete one claim so its slot can run again (logged, audited); the claim deleted, or
        None. Refused (BadInputError) while an attempt at the slot runs, unless `force`.
        A slot whose attempt was given up is freed too (see `release_slot`)."""
        claim, _ = await self.release_slot(job, key, force=force, actor=actor, reason=reason)
        return claim

    async def release_slot(
        self,
        job: str,
        key: str,
        *,
        force: bool = False,
        actor: str | None = None,
        reason: str | None = None,
    ) -> tuple[Claim | None, bool]:
        """`release`, saying also whether the slot had been given up (a failed, timed-out or
        cancelled attempt's final record): (the claim deleted, whether a given-up mark was
        cleared). Either way the slot can run again."""
        _check_key(key)
        action = self._action("release", job, f"{job} {key}", actor, reason)
        claim, given_up = await self.store.control.release(action, job, key, force=force)
        if claim is not None or given_up:
            events.emit(
                "run.released",
                "claim deleted by hand; the slot can run again"
                if claim is not None
                else "given-up slot freed by hand; the slot can run again",
                level=logging.WARNING,
                job=job,
                key=key,
                claimed_by=claim.claimed_by if claim is not None else None,
            )
        return claim, given_up

    async def skip_slot(self, job: str, key: str, *, reason: str, actor: str | None = None) -> None:
        """Settle a slot that did not run (given up, died, never run) as skipped on purpose,
        with a reason and an audit row: no replica starts it, `verify` accounts for it, and
        `release_slot` undoes it. Refused (BadInputError) if it ran or runs right now."""
        if not isinstance(reason, str) or not reason.strip():
            raise BadInputError("a skip needs a reason (--reason): it is what verify reports")
        _check_key(key)
        job = await self.resolve(job)
        action = self._action("skip", job, f"{job} {key}", actor, reason)
        await self.store.control.skip(action, job, key, _slot_of_default_key(key))
        events.emit(
            "run.skipped_on_purpose",
            "slot settled as skipped on purpose by an operator; it will not run",
            level=logging.WARNING,
            job=job,
            key=key,
            actor=action.actor,
            reason=reason,
        )

    # -- the task queue's operations ----------------------------------------------------

    async def list_tasks(
        self, state: TaskState | None = None, task: str | None = None, limit: int = 50
    ) -> list[TaskRecord]:
        """Tasks newest first, optionally of one state and one task name."""
        return await self.store.tasks.listing(state, task, limit)

    async def unrunnable_tasks(self) -> dict[str, int] | None:
        """Available tasks that no live worker leases (none registers their name), by name, with
        how many wait; None if no worker is live (or this database does not record workers)."""
        return await self.store.tasks.unrunnable(3 * ANNOUNCE_EVERY)

    async def tasks_without_worker(self, late: timedelta = LEEWAY) -> tuple[int, datetime] | None:
        """While no worker at all is live: how many available tasks have been due for longer
        than `late`, and since when the oldest has; None if a worker is live or none is late."""
        return await self.store.tasks.without_worker(3 * ANNOUNCE_EVERY, late.total_seconds())

    async def rename(
        self,
        old: str,
        new: str,
        *,
        force: bool = False,
        actor: str | None = None,
        reason: str | None = None,
    ) -> Renamed:
        """Carry a renamed job's history from `old` to `new` in one transaction (logged and
        audited): its claims, pauses, given-up and skipped slots, retry times, releases and
        other audit rows, and its first appearance, so the new name neither runs the slots
        the old one ran nor starts the ones it was holding back.

        Refused (BadInputError, nothing changed) if `old` has no history, if `new` has one,
        and while `old` is still a job of this app (its workers would run the moved slots
        again under the old name) unless `force`."""
        self.registry.check_job_name(new)
        if old == new:
            raise BadInputError(f"rename {old!r} to itself: nothing to do")
        if not force and old in {job.name for job in self.registry}:
            raise BadInputError(
                f"job {old!r} is still registered in this app: its workers would run the "
                "moved slots again under the old name; nothing renamed (run the rename with "
                "the release that names it only NEW, or pass --force)"
            )
        action = self._action("rename", new, f"{old} -> {new}", actor, reason)
        done = await self.store.control.rename(action, old, new, force=force)
        events.emit(
            "run.renamed",
            "job's history carried to its new name",
            level=logging.WARNING,
            job=new,
            old=old,
            moved=done.claims,
            left=0,
            records=done.records,
            pauses=done.pauses,
            audit=done.audit,
        )
        return done

    async def task_record(self, task_id: int) -> TaskRecord:
        """One task as it is now (its state, attempts, result); BadInputError if there is no
        such task (never enqueued, or pruned)."""
        rec = await self.store.tasks.get(_task_id(task_id))
        if rec is None:
            raise BadInputError(f"no task with id {task_id} (never enqueued, or pruned)")
        return rec

    async def task_errors(self, task_id: int, limit: int = ERRORS_SHOWN) -> TaskHistory:
        """A task's failed attempts, newest first (at most `limit`): each one's number, error
        and traceback, worker and time; none kept on a database older than schema 11."""
        await self.store.ensure_schema()
        return await self.store.views.task_errors(_task_id(task_id), limit)

    async def task_result(self, task_id: int, *, timeout: float | None = 30.0) -> Any:
        """What task `task_id` returned (None if it returned None), once it has succeeded:
        waits up to `timeout` seconds (None: as long as it takes), polling the database.

        TaskFailedError if it ended dead or discarded (its last error in the message),
        ResultTimeoutError if it is still queued or running at the deadline, BadInputError
        if there is no such task (never enqueued, or pruned with its result).
        """
        if timeout is not None and (
            not isinstance(timeout, (int, float)) or not 0 <= timeout < math.inf
        ):  # nan too: it compares false both ways, and would wait forever
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

    # -- operating it: pause, backfill, explain, cancel, the audit trail ----------------

    def _action(
        self, action: str, job: str | None, target: str, actor: str | None, reason: str | None
    ) -> Action:
        if actor is not None and (not isinstance(actor, str) or len(actor) > MAX_ACTOR):
            raise BadInputError(
                f"the actor must be a name of at most {MAX_ACTOR} characters, got {actor!r:.80}"
            )
        return Action(
            actor=actor or default_actor(), action=action, target=target, job=job, reason=reason
        )

    async def pause(
        self, job: str, *, reason: str | None = None, actor: str | None = None
    ) -> Pause:
        """Stop starting the job's slots whose time is at or after now (the database's
        clock), everywhere, from the next scheduling step on (a slot already running
        finishes; slots before the pause are not affected). Slots that fall inside the pause
        are not caught up on resume: `backfill` runs them. Audited; refused if the job is
        paused already. A schedule kept as data is paused as `app.schedules.pause` does."""
        name = await self.resolve(job)
        record = await self._schedule(name) if name not in self.registry_names else None
        if record is not None:
            await self.schedules.pause(record.name, reason=reason, by=actor)
            return (await self.store.control.pauses())[name]
        name = self._definition(name).name
        return await self.store.control.pause(self._action("pause", name, name, actor, reason))

    async def resume(
        self, job: str, *, reason: str | None = None, actor: str | None = None
    ) -> Pause:
        """End a job's pause at the database's clock (audited): slots from then on run as
        usual; the pause that ended. Refused if it is not paused. A schedule kept as data is
        resumed as `app.schedules.resume` does."""
        name = await self.resolve(job)
        record = await self._schedule(name) if name not in self.registry_names else None
        if record is not None:
            pause = (await self.store.control.pauses()).get(name)
            await self.schedules.resume(record.name, by=actor)
            ended = [p for p in await self.store.control.job_pauses(name) if p.resumed_at]
            return ended[-1] if ended else pause  # type: ignore[return-value]
        name = self._definition(name).name
        return await self.store.control.resume(self._action("resume", name, name, actor, reason))

    async def pauses(self) -> dict[str, Pause]:
        """The pauses in force, by job."""
        await self.store.ensure_schema()
        return await self.store.control.pauses()

    def backfill_slots(
        self, job: str, start: datetime, end: datetime, max_slots: int
    ) -> list[tuple[datetime, str]]:
        """The (slot, key) pairs of `job` in [start, end); BadInputError for a reversed range
        or one of more than `max_slots` (no database touched)."""
        definition = self._definition(job)
        start, end = _in_years(_aware(start)), _in_years(_aware(end))
        if isinstance(max_slots, bool) or not isinstance(max_slots, int) or max_slots < 1:
            raise BadInputError(f"max_slots must be an int of at least 1, got {max_slots!r}")
        if end <= start:
            raise BadInputError(
                f"bad range: --to {end.isoformat()} is not after --from {start.isoformat()}"
            )
        slots: list[tuple[datetime, str]] = []
        for slot in definition.schedule.slots_after(start - timedelta(microseconds=1)):
            if slot >= end:
                break
            if len(slots) >= max_slots:
                raise BadInputError(
                    f"the range holds more than {max_slots} slots of {job!r}: nothing ran "
                    "(narrow it, or raise --max-slots)"
                )
            slots.append((slot, definition.key_for(slot)))
        return slots

    async def refuse_future(
        self,
        job: str,
        at: datetime,
        *,
        allow: bool = False,
        by_database: bool = False,
        named: str | None = None,
        hint: str = "allow_future=True runs it on purpose",
    ) -> None:
        """Refuse (BadInputError) a slot later than the database's clock, beyond
        `clock.FUTURE_SKEW`, unless `allow` (then `run.future_allowed` says so): run early,
        its claim would make the real slot skip when it comes due. Without `by_database` the
        host's clock answers first, so a slot it calls due costs no round trip; with it (what
        `oncely run --now` asks, a host whose clock runs ahead included) the database's
        clock decides. A test clock stands in for both. `named` and `hint` word the error."""
        slot = self.slot(job, at)
        if not by_database and slot.at - clock.utcnow() <= clock.FUTURE_SKEW:
            return
        db_now = clock.utcnow() if clock.is_set() else await self.store.database_time()
        ahead = slot.at - db_now
        if ahead <= clock.FUTURE_SKEW:
            return
        if not allow:
            raise BadInputError(
                f"{named or job} names the slot {slot.at.isoformat()}, which is "
                f"{span(ahead)} ahead of the database's clock ({db_now.isoformat()}): "
                "running it now would claim it early, and the real slot would then be "
                f"skipped; {hint}"
            )
        _future_allowed(job, slot.key, slot.at, db_now)

    async def backfill_plan(
        self,
        job: str,
        start: datetime,
        end: datetime,
        *,
        max_slots: int = DEFAULT_MAX_SLOTS,
        allow_future: bool = False,
    ) -> list[PlannedSlot]:
        """Every slot of `job` in [start, end) with what `backfill` would do with it: `would
        run`, `already ran` (its claim), `running now` (its attempt), `given up` (an attempt
        failed, timed out or was cancelled: `oncely release` frees it first) or `not due`
        (later than the database's clock: refused unless `allow_future`). Changes nothing."""
        job = await self.resolve(job)
        slots = self.backfill_slots(job, start, end, max_slots)
        await self.store.ensure_schema()
        control = self.store.control
        claims = await control.claims(job, [key for _, key in slots])
        running = {a.key: a for a in await control.running(job)}
        given_up = await control.given_up(job, [key for _, key in slots])
        db_now = await self.store.database_time()
        plan = []
        for slot, key in slots:
            if key in claims:
                plan.append(PlannedSlot(job, key, slot, "already ran", claim=claims[key]))
            elif key in running:
                plan.append(PlannedSlot(job, key, slot, "running now", running=running[key]))
            elif key in given_up:
                plan.append(PlannedSlot(job, key, slot, "given up"))
            elif slot > db_now and not allow_future:
                plan.append(PlannedSlot(job, key, slot, "not due"))
            else:
                plan.append(PlannedSlot(job, key, slot, "would run"))
        return plan

    async def backfill(
        self,
        job: str,
        start: datetime,
        end: datetime,
        *,
        max_slots: int = DEFAULT_MAX_SLOTS,
        actor: str | None = None,
        reason: str | None = None,
        stop: asyncio.Event | None = None,
        on_result: Callable[[RunResult], None] | None = None,
        allow_future: bool = False,
        audit_as: str = "backfill",
    ) -> list[RunResult]:
        """Run the free slots of `job` in [start, end), oldest first, each as `run(now=slot)`
        would (its claim, its transaction: a slot that ran is skipped); one audit row, whose
        action is `audit_as` (the dashboard's "Run slot now" says `run_slot`). A set `stop`
        ends it after the current slot. The jobs's pause does not stop a backfill.

        A range holding a slot later than the database's clock is refused (BadInputError,
        audited, nothing ran): run early, its claim would make the real slot skip when it
        comes due. `allow_future=True` runs such slots on purpose (audited as such)."""
        job = await self.resolve(job)
        plan = await self.backfill_plan(
            job, start, end, max_slots=max_slots, allow_future=allow_future
        )
        definition = self._definition(job)
        target = f"{job} [{_aware(start).isoformat()}, {_aware(end).isoformat()})"
        action = self._action(audit_as, definition.name, target, actor, reason)
        await self._refuse_not_due(action, plan)
        results: list[RunResult] = []
        free = [p for p in plan if p.action == "would run"]
        future = await self._future_allowed(free) if allow_future else 0
        for planned in free:
            if stop is not None and stop.is_set():
                break
            result = await self._backfill_one(definition, planned)
            results.append(result)
            if on_result is not None:
                on_result(result)
        counts: dict[str, int] = {}
        for result in results:
            counts[result.status.value] = counts.get(result.status.value, 0) + 1
        summary = ", ".join(f"{k} {n}" for k, n in sorted(counts.items())) or "nothing to run"
        if len(results) < len(free):
            summary += f"; stopped after {len(results)} of {len(free)} free slots"
        if future:
            ahead = f"{future} slot{'s' if future != 1 else ''}"
            summary += f"; --allow-future: {ahead} ahead of the database's clock"
        await self.store.control.audited(action, summary)
        return results

    async def _refuse_not_due(self, action: Action, plan: list[PlannedSlot]) -> None:
        """Refuse (with an audit row) a backfill whose range holds slots not due yet."""
        ahead = [p for p in plan if p.action == "not due"]
        if not ahead:
            return
        error = BadInputError(
            f"the range holds {len(ahead)} slots of {action.job!r} not due yet (the first at "
            f"{ahead[0].slot.isoformat()}, later than the database's clock): nothing ran; end "
            "the range at the present, or pass --allow-future (allow_future=True) to run them "
            "now, after which the real slots are skipped when they come due"
        )
        await self.store.control.refused(action, error)
        raise error

    async def _future_allowed(self, free: list[PlannedSlot]) -> int:
        """Report each slot a backfill runs ahead of the database's clock on purpose."""
        db_now = await self.store.database_time()
        ahead = [p for p in free if p.slot > db_now]
        for planned in ahead:
            _future_allowed(planned.job, planned.key, planned.slot, db_now)
        return len(ahead)

    async def _backfill_one(self, definition: Job, planned: PlannedSlot) -> RunResult:
        """Run one slot of a backfill; a slot someone holds (busy) or that waits for another
        slot of the job (overlap) is tried again shortly, until it is decided."""
        deadline = time.monotonic() + BACKFILL_PATIENCE
        pause = 0.05
        while True:
            result = await run_slot(self.store, definition, planned.slot, planned.key, replica_id())
            if result.status not in (RunStatus.BUSY, RunStatus.OVERLAP):
                return result
            if time.monotonic() + pause > deadline:
                return result
            await asyncio.sleep(pause)  # a retry's backoff: the holder finishes meanwhile
            pause = min(pause * 2, 1.0)

    async def explain(self, job: str, slot: datetime | None = None) -> Explanation:
        """Why the slot of `job` due at `slot` (default: the latest due one) ran or did not,
        in one answer (see oncely.explain) from the claim, attempt records and pauses. A
        schedule kept as data may be named bare; while it is paused, its latest due slot is
        answered `paused` whatever that slot came to (the sentence says both)."""
        job = await self.resolve(job)
        definition = self._definition(job)
        await self.store.ensure_schema()
        now = await self.store.database_time()
        at = self.slot(job, slot if slot is not None else now)
        control = self.store.control
        records = await control.slot_records(definition.name, at.key, at.at)
        answer = explain_slot(
            job=definition.name,
            key=at.key,
            slot=at.at,
            now=now,
            catch_up=definition.catch_up,
            claim=await self.store.claims.get_claim(definition.name, at.key),
            records=records,
            pauses=await control.job_pauses(definition.name),
            first_seen=await control.first_seen(definition.name),
            releases=await control.releases(definition.name, key=at.key),
            budget=definition.policy.attempts,
        )
        if slot is None and job in self._data_jobs:
            return await self._paused_schedule(job, answer)
        return answer

    async def _schedule_jobs(self) -> list[Job]:
        """The jobs of every schedule kept as data (none on a database without them)."""
        found = []
        for record in await self.schedules.list():
            job = job_for(record, self.registry, self.tasks, strict=False)
            self._data_jobs[job.name] = job
            found.append(job)
        return found

    async def _paused_schedule(self, job: str, answer: Explanation) -> Explanation:
        """A paused schedule's answer: `paused`, whatever its latest due slot came to."""
        if answer.answer == "paused":
            return answer
        pause = (await self.store.control.pauses()).get(job)
        if pause is None:
            return answer
        why = f" ({pause.reason})" if pause.reason else ""
        sentence = (
            f"schedule {schedule_name(job)} is paused: by {pause.paused_by} at "
            f"{pause.paused_at.isoformat(timespec='seconds')}{why}; no slot of it starts until "
            f"it is resumed. Its latest due slot: {answer.sentence}"
        )
        fields = {
            **answer.fields,
            "paused_since": pause.paused_at.isoformat(),
            "by": pause.paused_by,
        }
        return dataclasses.replace(answer, answer="paused", sentence=sentence, fields=fields)

    async def verify(
        self,
        jobs: Sequence[str] | None = None,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        leeway: timedelta = LEEWAY,
    ) -> Verdict:
        """Is every expected slot accounted for? Each slot of each job (all, or `jobs`) in
        [since, until] with its fate by the model (see oncely.fates), and every finding,
        including waiting tasks that no live worker can run. `since` defaults to 24 hours
        before the database's now (or the job's first appearance, if later), `until` to now.
        Changes nothing. The schedules kept as data are checked too (all of them, or those
        `jobs` names), each from its first appearance or its last change of expression or
        zone, whichever is later (`oncely_jobs`)."""
        if jobs:
            definitions = [self._definition(await self.resolve(j)) for j in jobs]
        else:
            definitions = list(self.registry) + await self._schedule_jobs()
        since = _aware(since) if since is not None else None
        until = _aware(until) if until is not None else None
        if since is not None and until is not None and since > until:
            raise BadInputError(
                f"bad window: --since {since.isoformat()} is after --until {until.isoformat()}"
            )
        await self.store.ensure_schema()
        now = await self.store.database_time()
        end = until if until is not None else now
        if since is not None and since > end:
            raise BadInputError(
                f"bad window: --since {since.isoformat()} is after the database's now "
                f"{end.isoformat()}"
            )
        verdicts = [await self._verify_job(d, since, end, now, leeway) for d in definitions]
        start = since if since is not None else end - VERIFY_WINDOW
        findings = unrunnable_findings(await self.unrunnable_tasks())
        findings += no_worker_findings(await self.tasks_without_worker(leeway))
        return Verdict(start, end, now, tuple(verdicts), tuple(findings))

    async def _verify_job(
        self, job: Job, since: datetime | None, until: datetime, now: datetime, leeway: timedelta
    ) -> JobVerdict:
        control = self.store.control
        first = await control.first_seen(job.name)
        start = since
        widened = None
        if start is None:
            start = until - VERIFY_WINDOW
            if first is not None and first > start:
                start = first
            # A window that holds none of the job's slots (a weekly job) checks nothing:
            # it reaches back to the job's last expected slot instead.
            last = job.schedule.latest_at_or_before(until)
            if last is not None and last < start and (first is None or last >= first):
                start = widened = last
        slots: list[datetime] = []
        for slot in job.schedule.slots_after(start - timedelta(microseconds=1)):
            if slot > until:
                break
            if len(slots) >= VERIFY_MAX_SLOTS:
                raise BadInputError(
                    f"the window holds more than {VERIFY_MAX_SLOTS} slots of {job.name!r}: "
                    "narrow it with --since/--until"
                )
            slots.append(slot)
        rows = await control.ledger(job.name, start, until)
        ledger = JobLedger(
            job=job.name,
            slots=slots,
            key_for=job.key_for,
            first_seen=first,
            claims=rows.claims,
            records=rows.records,
            pauses=await control.job_pauses(job.name),
            releases=rows.releases,
        )
        return verify_job(ledger, now, leeway, widened)

    async def cancel(
        self,
        job: str,
        slot: datetime | None = None,
        *,
        actor: str | None = None,
        reason: str | None = None,
    ) -> list[int]:
        """Stop the running attempt of `job` (at `slot`, else any), in whatever process runs
        it: it notices within seconds, rolls back and gives the slot up (outcome `cancelled`,
        final: `release` frees it). An attempt in its first second is waited for.
        The ids of the attempts asked; BadInputError if none is running (nothing written)."""
        job = await self.resolve(job)
        definition = self._definition(job)
        key = self.slot(job, slot).key if slot is not None else None
        if not self.store.dialect.slot_locks:
            raise BadInputError(
                "on SQLite a running attempt holds the database's write lock until it ends, so "
                "it cannot be asked to stop: nothing changed (stop the process running it: "
                "SIGTERM rolls the attempt back; a job's timeout= works on SQLite too)"
            )
        await self.store.ensure_schema()
        running = await self._running_soon(definition, key)
        if not running:
            where = f" at slot {slot.isoformat()}" if slot is not None else ""
            raise BadInputError(
                f"no attempt of {definition.name!r}{where} is running: nothing to cancel"
            )
        target = ", ".join(f"{definition.name} {a.key}" for a in running)
        action = self._action("cancel", definition.name, target, actor, reason)
        asked = await self.store.control.cancel_attempts(action, running)
        if not asked:
            raise BadInputError(
                f"the attempt of {definition.name!r} ended meanwhile: nothing to cancel"
            )
        return asked

    async def _running_soon(self, job: Job, key: str | None) -> list[Attempt]:
        """The running attempts of a job (at one slot); an attempt records its start only
        after it has run `runner.LISTEN_AFTER`, so while the job's or a recent slot's lock is
        held with no record yet, the record is waited for (at most CANCEL_RECORD_WAIT)."""
        control = self.store.control
        running = await control.running(job.name, key)
        if running:
            return running
        keys = [key] if key is not None else self._recent_keys(job)
        if not await control.held(job.name, keys):
            return []
        deadline = time.monotonic() + CANCEL_RECORD_WAIT
        while not running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            running = await control.running(job.name, key)
        return running

    def _recent_keys(self, job: Job, n: int = 3) -> list[str]:
        """The keys of the job's latest `n` slots due now (what a running attempt may hold)."""
        keys: list[str] = []
        at: datetime | None = clock.utcnow()
        while at is not None and len(keys) < n:
            slot = job.schedule.latest_at_or_before(at)
            if slot is None:
                break
            keys.append(job.key_for(slot))
            at = slot - timedelta(microseconds=1)
        return keys

    async def cancel_task(
        self, task_id: int, *, actor: str | None = None, reason: str | None = None
    ) -> tuple[str, TaskRecord | None]:
        """Cancel a task: one that has not started is discarded ("discarded", its record); a
        running one gets a cancel request its worker acts on ("cancel requested", None).
        Audited; a task in another state is refused (TaskStateError)."""
        action = self._action("task_cancel", None, f"task {task_id}", actor, reason)
        return await self.store.control.cancel_task(action, _task_id(task_id))

    async def retry_task(
        self, task_id: int, *, actor: str | None = None, reason: str | None = None
    ) -> TaskRecord:
        """Run a dead, discarded or waiting task again now, with fresh attempts (audited)."""
        action = self._action("task_retry", None, f"task {task_id}", actor, reason)
        return await self.store.control.retry_task(action, _task_id(task_id))

    async def discard_task(
        self, task_id: int, *, actor: str | None = None, reason: str | None = None
    ) -> TaskRecord:
        """Discard a task that has not succeeded (audited); a running attempt rolls back."""
        action = self._action("task_discard", None, f"task {task_id}", actor, reason)
        return await self.store.control.discard_task(action, _task_id(task_id))

    async def explain_task(self, task_id: int) -> tuple[TaskRecord, str, str]:
        """A task's record, and (answer, sentence) about where it is and why."""
        rec = await self.store.tasks.get(_task_id(task_id))
        if rec is None:
            raise BadInputError(f"no task with id {task_id}")
        cancel = await self.store.control.task_cancel_request(task_id)
        answer, sentence = explain_task(rec, cancel)
        return rec, answer, sentence

    async def audit(self, job: str | None = None, limit: int = 50) -> list[AuditEntry]:
        """The operators' actions, newest first (of one job, or all)."""
        return await self.store.control.audit(job, limit)

    async def prune(
        self,
        older_than: timedelta,
        *,
        actor: str | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> dict[str, int]:
        """Delete finished tasks, claims, attempt records and ended pauses older than
        `older_than` before `now` (the database's clock by default), in one audited
        transaction; how many of each."""
        if older_than <= timedelta(0):
            raise BadInputError(f"--older-than must be positive, got {older_than}")
        if older_than > MAX_AGE:
            raise BadInputError(f"older_than {older_than} is over {MAX_AGE.days // 365} years")
        await self.store.ensure_schema()
        before = (_aware(now) if now else await self.store.database_time()) - older_than
        action = self._action("prune", None, f"older than {_age(older_than)}", actor, reason)
        return await self.store.control.prune(action, before)

    async def aclose(self) -> None:
        """Release the connection pool oncely opened (a user's engine stays open)."""
        if self._store is not None:
            await self._store.dispose()


def _age(delta: timedelta) -> str:
    """A duration as the CLI writes it: 30d, 12h, 90m, 45s (the largest exact unit)."""
    seconds = delta.total_seconds()
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


_RAISED = (RunStatus.FAILED, RunStatus.TIMEOUT, RunStatus.CANCELLED)


def _check_key(key: object) -> None:
    """BadInputError, before the database, for a slot key no claim can have."""
    problem = key_problem(key)
    if problem is not None:
        raise BadInputError(f"a slot key is {problem}")


def _slot_of_default_key(key: str) -> datetime | None:
    """The slot a default key names (its UTC instant), for a slot with no records yet."""
    try:
        slot = datetime.strptime(key, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return slot if default_key(slot) == key else None


MAX_ACTOR = 255
"""Characters: the longest actor name the audit trail stores."""
MAX_AGE = timedelta(weeks=5200)
"""The oldest `prune` reaches back (100 years): further is before any row, and overflows."""


def _task_id(task_id: object) -> int:
    """A task id as the database keys it (a positive 64-bit int), or BadInputError."""
    if isinstance(task_id, bool) or not isinstance(task_id, int) or not 0 < task_id < 2**63:
        raise BadInputError(f"a task id is a positive integer, got {task_id!r:.80}")
    return task_id


def _in_years(t: datetime) -> datetime:
    if not clock.MIN_YEAR <= t.year <= clock.MAX_YEAR:
        raise BadInputError(
            f"time {t.isoformat()} is out of range: the year must be "
            f"{clock.MIN_YEAR}-{clock.MAX_YEAR}"
        )
    return t


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


def _future_allowed(job: str, key: str, slot: datetime, db_now: datetime) -> None:
    """The one event of a slot run ahead of the database's clock on purpose."""
    events.emit(
        "run.future_allowed",
        "running a future slot on purpose: it will be skipped when due",
        level=logging.WARNING,
        job=job,
        key=key,
        slot=slot.isoformat(),
        database_now=db_now.isoformat(),
    )
