"""Schedules kept as data: `app.schedules.add/update/pause/resume/remove/list`, at runtime.

A schedule is a row of oncely_schedules: a cron expression (in an IANA zone) or an interval,
and what each slot runs: a registered task, enqueued in the slot's own transaction (the
one that holds its claim, so "once per slot" carries through to the task), or a registered
job, called in it with the stored JSON arguments. Its slots are claimed in the ledger under
`schedule:<name>` (`ledger_name`), so they have every fate, pause rule, `explain`,
`history`, `backfill` and `verify` of a code job's: `job_for` turns a row into the `Job` the
runner runs. Workers read the rows, so a change reaches every replica at its next look
(docs/design/fate.md, "Schedules as data").
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import inspect
import json
import math
import re
import threading
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from . import clock
from .errors import ConfigError, OncelyError, ScheduleError, UnknownJobError
from .identity import default_actor, replica_id
from .model import Claim, RunResult, ScheduleRecord, duration_text
from .registry import CATCH_UP_CHOICES, OVERLAP_CHOICES, Job, Registry
from .runner import Guard, run_slot
from .schedule import CronSchedule, Schedule, cron, default_key, every, in_words, zone_problem
from .store import LEDGER_PREFIX, Action, Store
from .store import advance_schedule as advance_statement
from .store import schedule_ledger_name as _ledger_name
from .tasks import TaskRegistry, check_json

T = TypeVar("T")

MAX_NAME = 200 - len(LEDGER_PREFIX)
"""Characters: the longest schedule name (its ledger name is a job name of at most 200)."""
MAX_ACTOR = 255
MAX_ARGS = 64 * 1024
"""Bytes: the largest JSON of a schedule's arguments (each worker reads them at every look)."""
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_UNSET: Any = object()
"""An `update` keyword not given (None is a value: no grace, no timeout)."""
_FIELDS = ("cron", "every", "tz", "task", "job", "args", "catch_up", "grace", "overlap", "timeout")


def ledger_name(name: str) -> str:
    """The job name a schedule's slots are claimed under in oncely_runs (`schedule:<name>`)."""
    return _ledger_name(name)


def schedule_name(job: str) -> str | None:
    """The schedule a ledger name belongs to (`schedule:<name>` -> name), else None."""
    return job[len(LEDGER_PREFIX) :] if job.startswith(LEDGER_PREFIX) else None


def parse_every(value: object) -> float:
    """An interval as seconds: a number of seconds, a timedelta, or `2s`, `15m`, `1h`,
    `1d`; a whole number of seconds, at least 1 (ScheduleError otherwise)."""
    seconds: float | None = None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        found = _DURATION.match(value)
        if found:
            seconds = float(found.group(1)) * _UNIT[found.group(2)]
    if seconds is None:
        raise ScheduleError(
            f"bad interval {value!r:.80}: use seconds, or a duration like 2s, 15m, 1h, 1d"
        )
    if not math.isfinite(seconds) or seconds < 1 or seconds != int(seconds):
        raise ScheduleError(
            f"bad interval {value!r:.80}: it must be a whole number of seconds, at least 1s"
        )
    if seconds > 366 * 86400:
        raise ScheduleError(f"bad interval {value!r:.80}: at most 366 days")
    return seconds


def _seconds(value: object, what: str) -> float | None:
    """`grace` or `timeout` as positive seconds (a number, a timedelta or a duration)."""
    if value is None:
        return None
    if isinstance(value, str):
        found = _DURATION.match(value)
        if found is None:
            raise ScheduleError(f"bad {what} {value!r:.80}: use a duration like 30s, 5m, 1h")
        value = float(found.group(1)) * _UNIT[found.group(2)]
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScheduleError(f"bad {what} {value!r:.80}: use seconds or a timedelta")
    if not math.isfinite(value) or value <= 0:
        raise ScheduleError(f"bad {what} {value!r:.80}: it must be more than 0 seconds")
    return float(value)


def schedule_of(record: ScheduleRecord) -> Schedule:
    """The slots of a schedule row: its cron expression in its zone, or its interval."""
    if record.cron is not None:
        return cron(record.cron, tz=record.tz)
    return every(seconds=record.every or 0)


def describe(record: ScheduleRecord) -> str:
    """The schedule in words, with its zone: `every day at 09:00 (Europe/Madrid)`."""
    words = in_words(schedule_of(record))
    return f"{words} ({record.tz})" if record.cron is not None else words


def job_for(
    record: ScheduleRecord, jobs: Registry, tasks: TaskRegistry, *, strict: bool = True
) -> Job:
    """The job the runner runs for a schedule's slots: named by its ledger name; each slot
    enqueues the task in the slot's transaction (idempotency key: ledger name and slot
    key), or calls the job's function there with the stored arguments. ScheduleError if the
    target is not registered here, unless not `strict` (the job then serves reads only:
    `explain`, `verify`; an attempt at one of its slots fails with that error)."""
    name = record.ledger_name
    args = dict(record.args)
    timeout = timedelta(seconds=record.timeout) if record.timeout is not None else None
    grace = timedelta(seconds=record.grace) if record.grace is not None else None
    if record.target_kind == "task":
        task = tasks.find(record.target)
        if task is None:
            return _unrunnable(record, jobs, tasks, strict, "task")

        async def enqueue(db: Any, now: datetime) -> None:
            key = f"{name}:{default_key(now)}"
            await task.enqueue(db, idempotency_key=key[:255], **args)

        func: Any = enqueue
        retry = None
        attempt = None
    else:
        try:
            target = jobs.job(record.target)
        except UnknownJobError:
            return _unrunnable(record, jobs, tasks, strict, "job")
        func = _calling(target, args)
        retry = target.retry
        attempt = target.attempt
    return Job(
        name=name,
        schedule=schedule_of(record),
        func=func,
        catch_up=record.catch_up,  # type: ignore[arg-type]
        grace=grace,
        overlap=record.overlap,  # type: ignore[arg-type]
        timeout=timeout,
        attempt=attempt,
        retry=retry,
    )


def _unrunnable(
    record: ScheduleRecord, jobs: Registry, tasks: TaskRegistry, strict: bool, kind: str
) -> Job:
    error = ScheduleError(
        f"schedule {record.name!r} runs {kind} {record.target!r}, which this app does not register"
    )
    if strict:
        raise error

    async def unrunnable(db: Any, now: datetime) -> None:
        raise error

    return Job(
        name=record.ledger_name,
        schedule=schedule_of(record),
        func=unrunnable,
        catch_up=record.catch_up,  # type: ignore[arg-type]
        overlap=record.overlap,  # type: ignore[arg-type]
    )


def advancing(name: str, expected: datetime, following: datetime | None) -> Guard:
    """The check a slot's attempt makes in its own transaction, right after its claim: move
    schedule `name`'s next slot from `expected` (the value read) to `following`, a
    compare-and-set. A slot that commits takes the schedule off the due list with it, so other
    replicas do not try it again; a failed attempt rolls that back, and the worker then moves it
    on itself (`ScheduleStore.advance`). If no row matched, a change (an update, a removal,
    another replica's slot) moved the schedule since it was read:
    the attempt is not started and its claim rolls back (`runner.attempt_slot`), so a removed
    schedule runs no slot after its removal committed."""
    statement = advance_statement(name, expected, following)

    async def moved(db: Any) -> bool:
        return bool((await db.execute(statement)).rowcount)

    return moved


def _calling(target: Job, args: dict[str, Any]) -> Any:
    """`target`'s function with the stored arguments bound, async if it is."""
    func = target.func
    if target.attempt is not None:  # a framework's attempt hands the function `now` alone
        return lambda now: func(now, **args)  # type: ignore[call-arg]
    if inspect.iscoroutinefunction(func):

        async def call(db: Any, now: datetime) -> None:
            await func(db, now, **args)

        return call

    def call_sync(db: Any, now: datetime) -> None:
        func(db, now, **args)

    return call_sync


class Schedules:
    """`app.schedules`: schedules kept as data, each change audited, read by every worker.

    Every method is async, with a `_sync` twin (`add_sync`, …) for synchronous code: it runs
    the call on a private event loop in a thread of its own, on a store of its own."""

    def __init__(self, store: Callable[[], Store], jobs: Registry, tasks: TaskRegistry) -> None:
        self._store = store
        self.jobs = jobs
        self.tasks = tasks

    @property
    def store(self) -> Store:
        return self._store()

    # -- reading ----------------------------------------------------------------------

    async def list(
        self, *, after: str | None = None, limit: int | None = None
    ) -> list[ScheduleRecord]:
        """The schedules by name: all, or `limit` of them with names after `after` (a page)."""
        if after is not None and not isinstance(after, str):
            raise ScheduleError(f"after must be a schedule name, got {after!r:.80}")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ScheduleError(f"limit must be an int of at least 1, got {limit!r:.80}")
        return await self.store.schedules.listing(after, limit)

    async def job(self, name: str) -> Job:
        """The job the workers run for a schedule's slots (see `job_for`): its schedule,
        `key_for`, `catch_up`, named by the schedule's ledger name."""
        return job_for(await self.get(name), self.jobs, self.tasks)

    async def get(self, name: str) -> ScheduleRecord:
        """One schedule; UnknownScheduleError if there is none of that name."""
        return await self.store.schedules.get(_name_arg(name))

    async def last_runs(self) -> dict[str, Claim]:
        """The newest claim of each schedule that ran a slot, by schedule name: one index
        lookup per schedule, whatever the length of the ledger."""
        await self.store.ensure_schema()
        return await self.store.schedules.last_claims()

    async def counts(self) -> tuple[int, int]:
        """(how many schedules, how many of them paused), without reading them."""
        return await self.store.schedules.counts()

    # -- changing ---------------------------------------------------------------------

    async def add(
        self,
        name: str,
        *,
        cron: str | None = None,
        every: float | str | timedelta | None = None,
        tz: str = "UTC",
        task: str | None = None,
        job: str | None = None,
        args: Mapping[str, Any] | None = None,
        catch_up: str = "latest",
        grace: float | timedelta | None = None,
        overlap: str = "skip",
        timeout: float | timedelta | None = None,
        paused: bool = False,
        by: str | None = None,
    ) -> ScheduleRecord:
        """Add a schedule; its first slot is the first one after now (database time).

        Exactly one of `cron` (5 fields, in zone `tz`) and `every` (seconds, or `15m`), and
        one of `task` and `job` (registered in this app; `args` must bind to its function).
        ScheduleError, nothing written, for anything that does not hold."""
        self.check_new_name(name)
        values = self._checked(
            {
                "cron": cron,
                "every": every,
                "tz": tz,
                "task": task,
                "job": job,
                "args": args,
                "catch_up": catch_up,
                "grace": grace,
                "overlap": overlap,
                "timeout": timeout,
            }
        )
        if not isinstance(paused, bool):
            raise ScheduleError(f"paused must be True or False, got {paused!r:.80}")
        actor = _actor(by)
        now = await self._now()
        values.update(
            name=name,
            state="paused" if paused else "active",
            next_slot=_next_slot(values, now),
            version=1,
            created_at=now,
            changed_at=now,
            changed_by=actor,
        )
        action = Action(actor, "add", ledger_name(name), ledger_name(name), None)
        rec = await self.store.schedules.add(values, action, _added(values), paused=paused)
        return rec

    async def update(
        self,
        name: str,
        *,
        cron: Any = _UNSET,
        every: Any = _UNSET,
        tz: Any = _UNSET,
        task: Any = _UNSET,
        job: Any = _UNSET,
        args: Any = _UNSET,
        catch_up: Any = _UNSET,
        grace: Any = _UNSET,
        overlap: Any = _UNSET,
        timeout: Any = _UNSET,
        paused: Any = _UNSET,
        version: int | None = None,
        by: str | None = None,
    ) -> ScheduleRecord:
        """Change the given fields of a schedule (a field left out stays as it is; `grace=None`
        and `timeout=None` clear those). With `version`, refused (ScheduleError, nothing
        written) unless the schedule is still at that version: an edit form's read. A new
        expression, interval or zone decides the next slot from now on (database time): a
        slot that ran never runs again, a slot due but not yet started is not started.
        `paused` pauses or resumes it (audited as such). ScheduleError, nothing written, for
        anything that does not hold."""
        given = {
            "cron": cron,
            "every": every,
            "tz": tz,
            "task": task,
            "job": job,
            "args": args,
            "catch_up": catch_up,
            "grace": grace,
            "overlap": overlap,
            "timeout": timeout,
        }
        given = {k: v for k, v in given.items() if v is not _UNSET}
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise ScheduleError(f"version must be an int, got {version!r:.20}: nothing changed")
        current = await self.get(name)
        actor = _actor(by)
        if version is not None and version != current.version:
            raise ScheduleError(
                f"schedule {current.name!r} was changed since (it is at version "
                f"{current.version}, not {version!r:.20}): nothing changed"
            )
        read = current.version
        if given:
            current = await self._change(current, given, actor)
        if version is not None and current.version == read:
            # Nothing written: the version read must still hold when the answer is given
            # (a change that lands after the read makes this edit stale, whatever its values).
            await self.store.schedules.confirm(current.name, version)
        if paused is not _UNSET:
            if not isinstance(paused, bool):
                raise ScheduleError(f"paused must be True or False, got {paused!r:.80}")
            if paused and current.state == "active":
                current = await self.pause(name, by=actor)
            elif not paused and current.state == "paused":
                current = await self.resume(name, by=actor)
        return current

    async def _change(
        self, current: ScheduleRecord, given: dict[str, Any], actor: str
    ) -> ScheduleRecord:
        merged = _as_given(current)
        if "cron" in given and given["cron"] is not None:
            merged["every"] = None
        if "every" in given and given["every"] is not None:
            merged["cron"] = None
        if "task" in given and given["task"] is not None:
            merged["job"] = None
        if "job" in given and given["job"] is not None:
            merged["task"] = None
        merged.update(given)
        values = self._checked(merged)
        before = _as_values(current)
        changed = {k: v for k, v in values.items() if before.get(k) != v}
        if not changed:
            return current
        now = await self._now()
        if {"cron", "every_seconds", "tz"} & set(changed):
            changed["next_slot"] = _next_slot(values, now)
        result = "; ".join(f"{k} {before.get(k)!r} -> {v!r}" for k, v in changed.items())
        changed.update(changed_at=now, changed_by=actor)
        action = Action(actor, "update", current.ledger_name, current.ledger_name, None)
        return await self.store.schedules.change(
            current.name, current.version, changed, action, result[:2000]
        )

    async def pause(
        self, name: str, *, reason: str | None = None, by: str | None = None
    ) -> ScheduleRecord:
        """Stop starting the schedule's slots from now on, everywhere (a slot running
        finishes); audited. ScheduleError if it is paused already."""
        name = _name_arg(name)
        if reason is not None and not isinstance(reason, str):
            raise ScheduleError(f"the reason must be a str, got {reason!r:.80}")
        actor = _actor(by)
        now = await self._now()
        values = {"state": "paused", "pause_reason": reason, "changed_at": now, "changed_by": actor}
        action = Action(actor, "pause", ledger_name(name), ledger_name(name), reason)
        return await self.store.schedules.pause(name, values, action)

    async def resume(self, name: str, *, by: str | None = None) -> ScheduleRecord:
        """Start the schedule's slots again from its first slot after now (the slots of the
        pause are not caught up: `oncely backfill` runs them); audited. ScheduleError if it
        is not paused."""
        current = await self.get(name)
        actor = _actor(by)
        now = await self._now()
        values = {
            "state": "active",
            "pause_reason": None,
            "next_slot": _next_slot(_as_values(current), now),
            "changed_at": now,
            "changed_by": actor,
        }
        action = Action(actor, "resume", current.ledger_name, current.ledger_name, None)
        return await self.store.schedules.resume(current.name, values, action)

    async def remove(self, name: str, *, by: str | None = None) -> None:
        """Delete a schedule: no slot of it starts from then on. An attempt running meanwhile
        finishes (its slot stays claimed in the ledger, as history); audited."""
        name = _name_arg(name)
        actor = _actor(by)
        action = Action(actor, "remove", ledger_name(name), ledger_name(name), None)
        await self.store.schedules.remove(name, action)

    async def run_due(self, name: str, *, by: str | None = None) -> RunResult:
        """Run the schedule's latest due slot now, through its claim (once: a second call
        for the same slot comes back `skipped`); never a future slot, nor one from before
        the schedule was added. Audited as `run_slot`. Runs while the schedule is paused."""
        rec = await self.get(name)
        actor = _actor(by)
        job = job_for(rec, self.jobs, self.tasks)
        now = await self._now()
        slot = job.schedule.latest_at_or_before(now)
        if slot is None or slot < rec.created_at:
            raise ScheduleError(
                f"no slot of schedule {rec.name!r} has come due since it was added: nothing ran"
            )
        key = job.key_for(slot)
        result = await run_slot(self.store, job, slot, key, replica_id())
        if rec.next_slot is not None and rec.next_slot <= slot:
            following = job.schedule.next_after(slot)
            with contextlib.suppress(OncelyError):
                await self.store.schedules.advance(rec.name, rec.next_slot, following)
        action = Action(actor, "run_slot", f"{rec.ledger_name} {key}", rec.ledger_name, None)
        await self.store.schedules.audited(action, result.status.value)
        return result

    # -- the synchronous twins --------------------------------------------------------

    def add_sync(self, name: str, **fields: Any) -> ScheduleRecord:
        """`add`, for synchronous code."""
        return self._sync(lambda s: s.add(name, **fields))

    def update_sync(self, name: str, **fields: Any) -> ScheduleRecord:
        """`update`, for synchronous code."""
        return self._sync(lambda s: s.update(name, **fields))

    def pause_sync(
        self, name: str, *, reason: str | None = None, by: str | None = None
    ) -> ScheduleRecord:
        """`pause`, for synchronous code."""
        return self._sync(lambda s: s.pause(name, reason=reason, by=by))

    def resume_sync(self, name: str, *, by: str | None = None) -> ScheduleRecord:
        """`resume`, for synchronous code."""
        return self._sync(lambda s: s.resume(name, by=by))

    def remove_sync(self, name: str, *, by: str | None = None) -> None:
        """`remove`, for synchronous code."""
        self._sync(lambda s: s.remove(name, by=by))

    def list_sync(
        self, *, after: str | None = None, limit: int | None = None
    ) -> builtins.list[ScheduleRecord]:
        """`list`, for synchronous code."""
        return self._sync(lambda s: s.list(after=after, limit=limit))

    def job_sync(self, name: str) -> Job:
        """`job`, for synchronous code."""
        return self._sync(lambda s: s.job(name))

    def get_sync(self, name: str) -> ScheduleRecord:
        """`get`, for synchronous code."""
        return self._sync(lambda s: s.get(name))

    def run_due_sync(self, name: str, *, by: str | None = None) -> RunResult:
        """`run_due`, for synchronous code."""
        return self._sync(lambda s: s.run_due(name, by=by))

    def last_runs_sync(self) -> dict[str, Claim]:
        """`last_runs`, for synchronous code."""
        return self._sync(lambda s: s.last_runs())

    def counts_sync(self) -> tuple[int, int]:
        """`counts`, for synchronous code."""
        return self._sync(lambda s: s.counts())

    def _sync(self, call: Callable[[Schedules], Coroutine[Any, Any, T]]) -> T:
        """Run `call` on a store of its own (the app's engine belongs to the app's loop), on
        a private event loop in a thread (so it works inside a running loop too)."""
        url = self.store.url
        out: list[Any] = []

        async def go() -> None:
            store = Store.from_url(url)
            try:
                out.append(await call(Schedules(lambda: store, self.jobs, self.tasks)))
            except BaseException as exc:  # handed to the calling thread, raised there
                out.append(_Raised(exc))
            finally:
                await store.dispose()

        thread = threading.Thread(target=asyncio.run, args=(go(),), name="oncely-schedules")
        thread.start()
        thread.join()
        if out and isinstance(out[0], _Raised):
            raise out[0].error
        return out[0]  # type: ignore[no-any-return]

    # -- checks -----------------------------------------------------------------------

    async def _now(self) -> datetime:
        if clock.is_set():
            return clock.utcnow()
        await self.store.ensure_schema()
        return await self.store.database_time()

    def check_new_name(self, name: object) -> str:
        """`name` if a new schedule may take it (valid, not a code job's); ScheduleError."""
        name = _name_arg(name)
        if name.startswith(LEDGER_PREFIX):
            # Its ledger name would be `schedule:schedule:…`, and `schedule:<rest>` names
            # the schedule `<rest>` wherever a command takes a ledger name (release, history).
            raise ScheduleError(
                f"schedule name {name!r:.80} starts with {LEDGER_PREFIX!r}, which names schedule "
                f"{name[len(LEDGER_PREFIX) :]!r:.80} in the ledger: choose another name"
            )
        if name in {job.name for job in self.jobs}:
            raise ScheduleError(
                f"{name!r} is the name of a job in the code: choose another schedule name"
            )
        return name

    def _checked(self, given: dict[str, Any]) -> dict[str, Any]:
        """The columns of a schedule from add's fields, every one checked."""
        unknown = set(given) - set(_FIELDS)
        if unknown:  # pragma: no cover - the signatures name every field
            raise ScheduleError(f"unknown fields: {', '.join(sorted(unknown))}")
        expr, seconds, tz = _when(given.get("cron"), given.get("every"), given.get("tz"))
        kind, target, args = self._target(given.get("task"), given.get("job"), given.get("args"))
        catch_up, overlap = given.get("catch_up", "latest"), given.get("overlap", "skip")
        if catch_up not in CATCH_UP_CHOICES:
            raise ScheduleError(
                f"catch_up must be one of {', '.join(CATCH_UP_CHOICES)}, got {catch_up!r:.80}"
            )
        if overlap not in OVERLAP_CHOICES:
            raise ScheduleError(
                f"overlap must be one of {', '.join(OVERLAP_CHOICES)}, got {overlap!r:.80}"
            )
        return {
            "cron": expr,
            "every_seconds": seconds,
            "tz": tz,
            "target_kind": kind,
            "target": target,
            "args": json.dumps(args, sort_keys=True),
            "catch_up": catch_up,
            "grace_seconds": _seconds(given.get("grace"), "grace"),
            "overlap": overlap,
            "timeout_seconds": _seconds(given.get("timeout"), "timeout"),
        }

    def _target(self, task: object, job: object, args: object) -> tuple[str, str, dict[str, Any]]:
        if (task is None) == (job is None):
            raise ScheduleError("a schedule runs exactly one target: pass task=NAME or job=NAME")
        if args is None:
            args = {}
        if not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args):
            raise ScheduleError(
                f"args must be a JSON object of keyword arguments, got {args!r:.80}"
            )
        args = dict(args)
        try:
            check_json(args, "args")
        except OncelyError as exc:
            raise ScheduleError(str(exc)) from None
        size = len(json.dumps(args, sort_keys=True).encode())
        if size > MAX_ARGS:
            raise ScheduleError(
                f"args are {size} bytes of JSON, over the limit of {MAX_ARGS} (64 KiB): store "
                "large data in a table of your own and pass its id"
            )
        if task is not None:
            found = self.tasks.find(task) if isinstance(task, str) else None
            if found is None:
                known = ", ".join(sorted(t.name for t in self.tasks)) or "none registered"
                raise ScheduleError(f"unknown task {task!r:.80} (known tasks: {known})")
            try:
                found.entry(args)
            except OncelyError as exc:
                raise ScheduleError(str(exc)) from None
            return "task", found.name, args
        try:
            target = self.jobs.job(job) if isinstance(job, str) else None
        except UnknownJobError as exc:
            raise ScheduleError(str(exc)) from None
        if target is None:
            raise ScheduleError(f"unknown job {job!r:.80}")
        _bind_job(target, args)
        return "job", target.name, args


def _bind_job(target: Job, args: dict[str, Any]) -> None:
    try:
        sig = inspect.signature(target.func)
        if target.attempt is not None:
            sig.bind(None, **args)
        else:
            sig.bind(None, None, **args)
    except TypeError as exc:
        raise ScheduleError(f"job {target.name!r} cannot take these arguments: {exc}") from None
    except ValueError:  # pragma: no cover - a builtin without a signature
        pass


def _when(expr: object, interval: object, tz: object) -> tuple[str | None, float | None, str]:
    if (expr is None) == (interval is None):
        raise ScheduleError("a schedule has exactly one of a cron expression and an interval")
    if tz is None:
        tz = "UTC"
    problem = zone_problem(tz)
    if problem is not None:
        raise ScheduleError(problem)
    tz = str(tz)
    if expr is None:
        # An interval's slots are multiples of it since the Unix epoch, whatever the zone;
        # the zone is kept (checked) for the time shown, and for a later cron expression.
        return None, parse_every(interval), tz
    if not isinstance(expr, str) or len(expr) > 200:
        raise ScheduleError(f"bad cron expression {expr!r:.80}")
    schedule = CronSchedule(expr, tz)
    try:
        schedule.check()
    except ConfigError as exc:
        raise ScheduleError(str(exc)) from None
    return schedule.expr, None, tz


def _name_arg(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ScheduleError(f"a schedule name is a non-empty str, got {name!r:.80}")
    try:
        Registry.check_name(name)
    except ConfigError:
        raise ScheduleError(
            f"schedule name {name!r:.80} is not valid: use letters, digits, _ . : - "
            f"(at most {MAX_NAME}, starting with a letter or _)"
        ) from None
    if len(name) > MAX_NAME:
        raise ScheduleError(f"schedule name {name[:40]!r}… is longer than {MAX_NAME} characters")
    return name


def _actor(by: object) -> str:
    if by is None:
        return default_actor()
    if not isinstance(by, str) or not by or len(by) > MAX_ACTOR:
        raise ScheduleError(f"by= must be a name of at most {MAX_ACTOR} characters, got {by!r:.80}")
    return by


def _next_slot(values: Mapping[str, Any], now: datetime) -> datetime | None:
    """The first slot strictly after `now` of the schedule in `values` (its columns)."""
    if values.get("cron") is not None:
        schedule: Schedule = cron(values["cron"], tz=values.get("tz") or "UTC")
    else:
        schedule = every(seconds=values["every_seconds"])
    return schedule.next_after(now)


def _as_given(rec: ScheduleRecord) -> dict[str, Any]:
    """A record as add's keyword fields."""
    return {
        "cron": rec.cron,
        "every": rec.every,
        "tz": rec.tz,
        "task": rec.target if rec.target_kind == "task" else None,
        "job": rec.target if rec.target_kind == "job" else None,
        "args": rec.args,
        "catch_up": rec.catch_up,
        "grace": rec.grace,
        "overlap": rec.overlap,
        "timeout": rec.timeout,
    }


def _as_values(rec: ScheduleRecord) -> dict[str, Any]:
    """A record as its columns (those a change compares)."""
    return {
        "cron": rec.cron,
        "every_seconds": rec.every,
        "tz": rec.tz,
        "target_kind": rec.target_kind,
        "target": rec.target,
        "args": json.dumps(rec.args, sort_keys=True),
        "catch_up": rec.catch_up,
        "grace_seconds": rec.grace,
        "overlap": rec.overlap,
        "timeout_seconds": rec.timeout,
    }


def _added(values: Mapping[str, Any]) -> str:
    when = (
        f"cron {values['cron']!r} ({values['tz']})"
        if values["cron"] is not None
        else f"every {duration_text(values['every_seconds'])}"
    )
    paused = ", paused" if values["state"] == "paused" else ""
    return f"added: {when} -> {values['target_kind']} {values['target']}{paused}"


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error


__all__ = [
    "Schedules",
    "advancing",
    "describe",
    "job_for",
    "ledger_name",
    "parse_every",
    "schedule_name",
    "schedule_of",
]
