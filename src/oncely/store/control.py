"""The control plane's side of the store: pauses, attempt records, cancel requests, the audit
trail, and the operator's actions that change the ledger or the queue.

Every operator action runs in one transaction together with its audit row, so the trail
never says an action happened that did not (nor misses one that did). A refused action
whose target exists (a running slot to release, a task in the wrong state) leaves an audit
row of its own that says so; bad input (no such job, nothing running) writes nothing.

Attempt records are written outside the job's transaction, in short transactions of their
own: a failed attempt's claim still rolls back while its record stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from ..errors import BadInputError, OncelyError, SchemaMissingError, TaskStateError
from ..model import (
    OPERATOR_SKIP,
    Attempt,
    AuditEntry,
    Claim,
    Pause,
    Release,
    Renamed,
    TaskRecord,
)
from . import sql, task_queue_sql
from .database import Database
from .dialect import Dialect
from .rows import attempt_from_row, audit_from_row, claim_from_row, record
from .session import pause_read
from .task_queue import TaskQueue

CANCEL_BUSY_MS = 2000
"""How long a cancel waits on SQLite for the write lock (which a running attempt holds)."""
ERROR_TEXT_MAX = 2000
"""Characters of an error message kept in an attempt record."""


@dataclass(frozen=True)
class JobLedgerRows:
    """One job's recorded rows over a window, as `Control.ledger` reads them."""

    claims: list[Claim]
    records: list[Attempt]
    releases: list[Release]
    """Each release an operator made (refused ones left out), oldest first."""


@dataclass(frozen=True)
class Action:
    """Who does what to which target, and why: the audit row's fields but its result."""

    actor: str
    action: str
    target: str
    job: str | None = None
    reason: str | None = None


def _pause(row: Any) -> Pause:
    return Pause(
        job=row.job,
        paused_at=row.paused_at,
        paused_by=row.paused_by,
        reason=row.reason,
        resumed_at=row.resumed_at,
        resumed_by=row.resumed_by,
    )


def _process_alive(host: str | None, pid: int | None) -> bool:
    """Whether the process that recorded an attempt still runs (known on this host only;
    another host's process is taken to be alive)."""
    if host != socket.gethostname() or pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class CancelSignals:
    """Wakes running attempts of this process when an operator cancels one, where the
    database can notify (Postgres: LISTEN on one connection while any attempt is watched);
    elsewhere (or if LISTEN fails) `listening` is False and attempts poll alone."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.listening = False
        self._events: dict[int, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None

    @contextlib.asynccontextmanager
    async def watch(self, attempt_id: int) -> AsyncIterator[asyncio.Event]:
        """An event set when attempt `attempt_id` is cancelled, while the block runs."""
        event = self._events[attempt_id] = asyncio.Event()
        try:
            if self._task is None:
                self._ready = asyncio.Event()
                self._task = asyncio.create_task(self._listen(self._ready))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._ready.wait()), 5.0)  # type: ignore[union-attr]
            yield event
        finally:
            self._events.pop(attempt_id, None)
            if not self._events and self._task is not None:
                task, self._task = self._task, None
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                self.listening = False

    async def _listen(self, ready: asyncio.Event) -> None:
        try:
            listener = self.db.dialect.cancel_listener(self.db.engine, self._notified)
            async with listener as works:
                self.listening = works
                ready.set()
                await asyncio.Event().wait()  # until the last watcher leaves
        finally:
            self.listening = False
            ready.set()

    def _notified(self, attempt_id: int) -> None:
        event = self._events.get(attempt_id)
        if event is not None:
            event.set()


async def write_audit(conn: AsyncConnection, dialect: Dialect, action: Action, result: str) -> None:
    """Write an operator action's audit row in `conn`'s open transaction (the action's own)."""
    values = {
        "at": dialect.now(),
        "actor": action.actor[:255],
        "action": action.action,
        "job": action.job,
        "target": action.target[:500],
        "reason": action.reason,
        "result": result,
    }
    await conn.execute(sql.audit_row(values))


class Control:
    """Pauses, attempt records, cancel requests and audited operator actions on one store."""

    def __init__(self, db: Database, tasks: TaskQueue) -> None:
        self.db = db
        self.tasks = tasks
        self.dialect = db.dialect
        self.signals = CancelSignals(db)
        self._seen: set[str] = set()
        """Jobs whose first appearance this process has recorded."""

    # -- plumbing -----------------------------------------------------------------------

    async def _need(self) -> None:
        await self.db.ensure_schema()
        if not self.db.has_control:
            raise SchemaMissingError(
                f"oncely's tables in {self.db.display_url} predate the control plane "
                "(pause, explain, cancel, audit): run `oncely migrate`"
            )

    @contextlib.asynccontextmanager
    async def _write(
        self, busy_ms: int | None = None, *, record: bool = False
    ) -> AsyncIterator[AsyncConnection]:
        """A transaction of its own (`record`: a single write, autocommitted where it can)."""
        with self.db.translate():
            async with self.db.engine.connect() as conn:
                if busy_ms is not None:
                    conn = await conn.execution_options(**self.dialect.busy_options(busy_ms))
                if record:
                    conn = await conn.execution_options(**self.dialect.record_options())
                async with conn.begin():
                    yield conn

    async def _audit(self, conn: AsyncConnection, action: Action, result: str) -> None:
        await write_audit(conn, self.dialect, action, result)

    async def refused(self, action: Action, error: OncelyError) -> None:
        """Record a refused action (its target exists) in a transaction of its own."""
        with contextlib.suppress(OncelyError):
            async with self._write() as conn:
                await self._audit(conn, action, f"refused: {error}")

    async def audited(self, action: Action, result: str) -> None:
        """Record an action whose own writes are elsewhere (a backfill's slots)."""
        await self._need()
        async with self._write() as conn:
            await self._audit(conn, action, result)

    # -- attempt records ----------------------------------------------------------------

    def _origin(self, replica: str) -> dict[str, Any]:
        return {"replica": replica[:255], "host": socket.gethostname()[:255], "pid": os.getpid()}

    async def start_attempt(self, job: str, key: str, slot: datetime, replica: str) -> int | None:
        """Record that an attempt at a slot runs; its id (None on a database without the
        control plane's tables)."""
        if not self.db.has_control:
            return None
        now = self.dialect.now()
        values = {
            "job": job,
            "key": key,
            "slot": slot,
            "started_at": now,
            "recorded_at": now,
            **self._origin(replica),
        }
        async with self._write(record=True) as conn:
            return int((await conn.execute(sql.record_attempt(values))).scalar_one())

    async def end_attempt(self, attempt_id: int, outcome: str, error: BaseException | None) -> None:
        """Record what a started attempt came to."""
        values: dict[str, Any] = {"outcome": outcome, "finished_at": self.dialect.now()}
        if error is not None:
            values["error_class"] = type(error).__name__[:200]
            values["error"] = str(error)[:ERROR_TEXT_MAX]
        async with self._write(record=True) as conn:
            await conn.execute(sql.end_attempt(attempt_id, values))

    async def ended_attempt(
        self,
        job: str,
        key: str,
        slot: datetime,
        replica: str,
        outcome: str,
        error: BaseException | None,
        *,
        started_at: datetime | None,
    ) -> None:
        """Record an attempt whose start was not recorded (it was quick), once it ended."""
        if not self.db.has_control:
            return
        now = self.dialect.now()
        values: dict[str, Any] = {
            "job": job,
            "key": key,
            "slot": slot,
            "outcome": outcome,
            "started_at": started_at or now,
            "finished_at": now,
            "recorded_at": now,
            **self._origin(replica),
        }
        if error is not None:
            values["error_class"] = type(error).__name__[:200]
            values["error"] = str(error)[:ERROR_TEXT_MAX]
        async with self._write(record=True) as conn:
            await conn.execute(sql.record_attempt(values))

    def fate_record(
        self,
        attempt_id: int | None,
        ended: dict[str, Any],
        error: BaseException | None,
    ) -> tuple[Any, Any]:
        """The statement that writes a failed attempt's end in its own transaction (see
        `Store.give_up`): its started row updated, or a whole row. `ended` holds job, key,
        slot, replica, outcome, started_at, final and retry_at."""
        now = self.dialect.now()
        values: dict[str, Any] = {
            "outcome": ended["outcome"],
            "finished_at": now,
            "final": ended["final"],
            "retry_at": ended["retry_at"],
        }
        if error is not None:
            values["error_class"] = type(error).__name__[:200]
            values["error"] = str(error)[:ERROR_TEXT_MAX]
        if attempt_id is not None:
            return sql.end_attempt(attempt_id, values), None
        values.update(
            job=ended["job"],
            key=ended["key"],
            slot=ended["slot"],
            started_at=ended["started_at"] or now,
            recorded_at=now,
            **self._origin(ended["replica"]),
        )
        return sql.record_attempt(values), None

    async def forget_attempt(self, attempt_id: int) -> None:
        """Delete the record of an attempt that did not claim its slot."""
        async with self._write(record=True) as conn:
            await conn.execute(sql.forget_attempt(attempt_id))

    async def note(
        self,
        job: str,
        key: str | None,
        slot: datetime,
        outcome: str,
        replica: str,
        *,
        slot_last: datetime | None = None,
        reason: str | None = None,
    ) -> None:
        """Record a slot a worker did not start (`overlap`, or a `missed` range and why)."""
        if not self.db.has_control:
            return
        values = {
            "job": job,
            "key": key,
            "slot": slot,
            "slot_last": slot_last,
            "outcome": outcome,
            "recorded_at": self.dialect.now(),
            "error": reason,
            **self._origin(replica),
        }
        async with self._write(record=True) as conn:
            await conn.execute(sql.record_attempt(values))

    async def duplicate(self, job: str, key: str, slot: datetime, replica: str) -> None:
        """Record a suppressed duplicate attempt (none on a database older than schema 8)."""
        if not self.db.has_duplicates:
            return
        values = {
            "job": job,
            "key": key,
            "slot": slot,
            "replica": replica[:255],
            "recorded_at": self.dialect.now(),
        }
        async with self._write(record=True) as conn:
            await conn.execute(sql.record_duplicate(values))

    async def cancel_request(self, attempt_id: int) -> str | None:
        """Who asked this running attempt to stop (None: nobody)."""
        rows = await self.db.read(sql.cancel_request(attempt_id))
        return str(rows[0][0]) if rows else None

    async def slot_records(self, job: str, key: str, slot: datetime) -> list[Attempt]:
        """Every record of one slot, oldest first; attempts with no outcome say if alive."""
        await self._need()
        rows = await self.db.read(sql.slot_attempts(job, key, slot))
        found = []
        for row in rows:
            alive = False
            if row.outcome is None and row.started_at is not None:
                alive = await self._holding(row)
            found.append(attempt_from_row(row, alive))
        return found

    async def running(self, job: str, key: str | None = None) -> list[Attempt]:
        """Attempts of a job (at one slot) that run right now somewhere."""
        await self._need()
        rows = await self.db.read(sql.running_attempts(job, key))
        return [attempt_from_row(row, True) for row in rows if await self._holding(row)]

    async def held(self, job: str, keys: Sequence[str]) -> bool:
        """Whether an attempt of the job holds its job lock or one of these slots' locks right
        now (Postgres; read from pg_locks): one whose start is not recorded yet may run."""
        if not self.dialect.slot_locks:
            return False
        with self.db.translate():
            async with self.db.engine.connect() as conn:
                held = await self.dialect.job_held(conn, job)
                for key in keys:
                    held = held or await self.dialect.slot_held(conn, job, key)
                await conn.rollback()
        return held

    async def _holding(self, row: Any) -> bool:
        """Whether the attempt of a record with no outcome still runs: its slot's lock is held
        (Postgres, read from pg_locks), or its process lives (SQLite, on this host)."""
        if not self.dialect.slot_locks:
            return _process_alive(row.host, row.pid)
        with self.db.translate():
            async with self.db.engine.connect() as conn:
                held = await self.dialect.slot_held(conn, row.job, row.key)
                await conn.rollback()
        return held

    async def claims(self, job: str, keys: Sequence[str]) -> dict[str, Claim]:
        """The claims of some slots of a job, by key."""
        found: dict[str, Claim] = {}
        for start in range(0, len(keys), 500):
            chunk = list(keys[start : start + 500])
            for row in await self.db.read(sql.claims_of(job, chunk)):
                found[row.key] = claim_from_row(row)
        return found

    async def given_up(self, job: str, keys: Sequence[str]) -> set[str]:
        """The keys, among some slots of a job, whose slot an attempt gave up (until an
        operator's release clears the mark)."""
        found: set[str] = set()
        for start in range(0, len(keys), 500):
            chunk = list(keys[start : start + 500])
            found.update(row.key for row in await self.db.read(sql.given_up_of(job, chunk)))
        return found

    # -- a job's ledger over a window: what `oncely verify` checks ------------------------

    async def seen_jobs(self, names: Sequence[str]) -> None:
        """Record the first appearance of these jobs (a job seen before keeps its first);
        nothing on a database without oncely_jobs."""
        new = [name for name in names if name not in self._seen]
        if not new or not self.db.has_jobs:
            return
        statement = sql.record_jobs(self.dialect.insert(), new, self.dialect.now())
        async with self._write(record=True) as conn:
            await conn.execute(statement)
        self._seen.update(new)  # once per process: `oncely run` in a loop writes it once

    async def pending_retries(
        self, jobs: Sequence[str], since: datetime, limit: int = 200
    ) -> list[tuple[str, datetime, datetime]]:
        """(job, slot, retry time) of the slots of `jobs` since `since` that wait for their
        retry policy (no final mark, no claim), soonest first; none before the control
        plane's schema 14."""
        if not jobs or not self.db.has_slot_fate:
            return []
        rows = await self.db.read(sql.pending_retries(list(jobs), since, limit))
        return [(r.job, r.slot, r.retry_at) for r in rows if r.slot is not None]

    async def first_seen(self, job: str) -> datetime | None:
        """When a job first appeared: its recorded first appearance, or its oldest claimed or
        attempted slot if older (an older oncely records no appearance); None: never seen."""
        await self._need()
        found: list[datetime] = []
        if self.db.has_jobs:
            found += [r[0] for r in await self.db.read(sql.first_seen(job))]
        for row in await self.db.read(sql.first_slots(job)):
            found += [t for t in row if t is not None]
        return min(found) if found else None

    async def first_seen_all(self) -> dict[str, datetime]:
        """When each recorded job first appeared, by name."""
        if not self.db.has_jobs:
            return {}
        return {r.name: r.first_seen for r in await self.db.read(sql.jobs_first_seen())}

    async def ledger(self, job: str, since: datetime, until: datetime) -> JobLedgerRows:
        """A job's claims, attempt records (those with no outcome say if alive) and releases
        for the slots in [since, until]."""
        await self._need()
        claims = [
            claim_from_row(r) for r in await self.db.read(sql.claims_between(job, since, until))
        ]
        records = []
        for row in await self.db.read(sql.records_between(job, since, until)):
            alive = False
            if row.outcome is None and row.started_at is not None:
                alive = await self._holding(row)
            records.append(attempt_from_row(row, alive))
        return JobLedgerRows(claims, records, await self.releases(job, since))

    async def releases(
        self, job: str, since: datetime | None = None, key: str | None = None
    ) -> list[Release]:
        """The operators' releases of a job's slots (at or after `since`; of one `key`),
        oldest first, from the audit (refused ones left out)."""
        found = []
        for row in await self.db.read(sql.releases_since(job, since, key)):
            target = str(row.target)
            if target.startswith(f"{job} ") and not str(row.result).startswith("refused"):
                released = target[len(job) + 1 :]
                found.append(Release(row.at, released, row.actor, row.reason, str(row.result)))
        return found

    # -- pauses -------------------------------------------------------------------------

    async def pauses(self) -> dict[str, Pause]:
        """The pauses in force, by job (none on a database without the control plane)."""
        if not self.db.has_control:
            return {}
        return {r.job: _pause(r) for r in await self.db.read(sql.pauses_in_force())}

    async def pause_in(self, session: AsyncSession, job: str, slot: datetime) -> Pause | None:
        """The pause of a job that holds the slot's time (paused_at <= slot < resumed_at, or
        still open), read in an attempt's open transaction."""
        if not self.db.has_control or pause_read(session, job, slot) is False:
            return None  # (or the attempt's claim read that none holds it)
        with self.db.translate():
            row = (await session.execute(sql.pause_covering(job, slot))).first()
        return _pause(row) if row is not None else None

    async def job_pauses(self, job: str) -> list[Pause]:
        """Every pause of one job, oldest first."""
        await self._need()
        return [_pause(r) for r in await self.db.read(sql.job_pauses(job))]

    async def pauses_since(self, since: datetime | None) -> dict[str, list[Pause]]:
        """By job, every pause still open or ended after `since`, oldest first (none on a
        database without the control plane)."""
        if not self.db.has_control:
            return {}
        found: dict[str, list[Pause]] = {}
        for row in await self.db.read(sql.pauses_since(since)):
            found.setdefault(row.job, []).append(_pause(row))
        return found

    async def pause(self, action: Action) -> Pause:
        """Put a pause of a job in force, with its audit row; refused if one is."""
        await self._need()
        job = action.job
        assert job is not None
        current = (await self.pauses()).get(job)
        if current is None:
            try:
                async with self._write() as conn:
                    row = (
                        await conn.execute(
                            sql.pause(job, self.dialect.now(), action.actor, action.reason)
                        )
                    ).one()
                    await self._audit(conn, action, "paused")
                    return _pause(row)
            except OncelyError:
                current = (await self.pauses()).get(job)
                if current is None:
                    raise
        error = BadInputError(
            f"job {job!r} is already paused (by {current.paused_by} at "
            f"{current.paused_at.isoformat(timespec='seconds')}): nothing changed"
        )
        await self.refused(action, error)
        raise error

    async def resume(self, action: Action) -> Pause:
        """End the pause in force of a job, with its audit row; refused if none is."""
        await self._need()
        job = action.job
        assert job is not None
        async with self._write() as conn:
            row = (await conn.execute(sql.resume(job, self.dialect.now(), action.actor))).first()
            if row is not None:
                await self._audit(conn, action, "resumed")
                return _pause(row)
        error = BadInputError(f"job {job!r} is not paused: nothing to resume")
        await self.refused(action, error)
        raise error

    # -- release, cancel ----------------------------------------------------------------

    async def rename(self, action: Action, old: str, new: str, *, force: bool) -> Renamed:
        """Carry job `old`'s history to `new` with the action's audit row, in one transaction:
        its claims, attempt records, pauses, suppressed duplicates, audit rows and first
        appearance. Refused (BadInputError, nothing written) if `old` has no claims, records
        or pauses, or if `new` has any (its history and OLD's would be mixed); `force` (OLD still
        registered) is only said in the audit row."""
        await self._need()
        async with self._write() as conn:
            claims, records, paused = (await conn.execute(sql.job_history(old))).one()
            if not claims + records + paused:
                raise BadInputError(
                    f"job {old!r} has no claims, attempt records or pauses: nothing to rename"
                )
            theirs = (await conn.execute(sql.job_history(new))).one()
            if sum(theirs):
                raise BadInputError(
                    f"job {new!r} already has a history ({theirs[0]} claims, {theirs[1]} "
                    f"attempt records, {theirs[2]} pauses): nothing renamed (two jobs' "
                    "histories are never mixed; pick a new name)"
                )
            for stmt in sql.rename_rows(old, new, with_duplicates=self.db.has_duplicates):
                await conn.execute(stmt)
            audited = int((await conn.execute(sql.rename_audit(old, new))).rowcount or 0)
            if self.db.has_jobs:
                for stmt in sql.rename_first_seen(old, new):
                    await conn.execute(stmt)
            done = Renamed(int(claims), int(records), int(paused), audited)
            forced = " (--force)" if force else ""
            await self._audit(conn, action, f"{done.summary()}{forced}")
        return done

    async def release(
        self, action: Action, job: str, key: str, *, force: bool
    ) -> tuple[Claim | None, bool]:
        """Delete one claim, or clear the given-up mark (and retry times) of a slot whose
        attempt was given up, with its audit row: (the claim deleted, whether a given-up mark
        was cleared). Refused (with a row) while an attempt at the slot runs, unless
        `force`; (None, False), nothing written, if there was neither."""
        await self._need()
        running = BadInputError(
            f"job {job!r} key {key!r} is running right now (or, on SQLite, another write "
            "holds the database): nothing released; try again when it has finished, or "
            "pass --force"
        )
        try:
            async with self._write(busy_ms=500) as conn:
                if not force and not await self.dialect.try_lock_slot(conn, job, key):
                    raise running
                row = (await conn.execute(sql.release(job, key))).first()
                marks = (await conn.execute(sql.release_marks(job, key))).rowcount
                if row is not None or marks:
                    forced = " (--force)" if force else ""
                    what = "released (given up)"
                    if row is not None:
                        ran = row.claimed_at.isoformat(timespec="seconds")
                        what = f"released (ran at {ran} by {row.claimed_by})"
                    await self._audit(conn, action, f"{what}{forced}")
        except OncelyError as exc:
            if exc is not running and not self.dialect.is_busy(exc.__cause__ or exc):
                raise
            await self.refused(action, running)
            raise running from None
        return (claim_from_row(row) if row is not None else None), bool(marks)

    async def skip(self, action: Action, job: str, key: str, slot: datetime | None) -> None:
        """Settle a slot that did not run as skipped on purpose: a final `operator_skip` note
        (the actor as its replica, the reason as its text, the slot's time as its records
        have it, else `slot`) with the action's audit row, in one transaction. Refused
        (BadInputError, with a refused row) if the slot ran, or while an attempt at it runs;
        `release` undoes it."""
        await self._need()
        ran = BadInputError(
            f"job {job!r} key {key!r} ran: nothing to skip (`oncely release` frees a slot that ran)"
        )
        running = BadInputError(
            f"job {job!r} key {key!r} is running right now (or, on SQLite, another write "
            "holds the database): nothing skipped; try again when it has finished"
        )
        now = self.dialect.now()
        note = {
            "job": job,
            "key": key,
            "outcome": OPERATOR_SKIP,
            "final": True,
            "finished_at": now,
            "recorded_at": now,
            "error": action.reason,
            **self._origin(action.actor),
        }
        try:
            async with self._write(busy_ms=500) as conn:
                if not await self.dialect.try_lock_slot(conn, job, key):
                    raise running
                if (await conn.execute(sql.get_claim(job, key))).first() is not None:
                    raise ran
                recorded = (await conn.execute(sql.slot_of_key(job, key))).scalar()
                note["slot"] = recorded if recorded is not None else slot
                await conn.execute(sql.record_attempt(note))
                await self._audit(conn, action, "skipped on purpose")
        except OncelyError as exc:
            busy = exc is running or self.dialect.is_busy(exc.__cause__ or exc)
            if exc is not ran and not busy:
                raise
            refusal = ran if exc is ran else running
            await self.refused(action, refusal)
            raise refusal from None

    async def cancel_attempts(self, action: Action, attempts: Sequence[Attempt]) -> list[int]:
        """Ask running attempts to stop, with one audit row; the ids that were still running.

        On Postgres the request also wakes the process running each (NOTIFY on commit).
        """
        await self._need()
        cancelled: list[int] = []
        try:
            async with self._write(busy_ms=CANCEL_BUSY_MS) as conn:
                for attempt in attempts:
                    stmt = sql.request_cancel(attempt.id, self.dialect.now(), action.actor)
                    if (await conn.execute(stmt)).rowcount:
                        cancelled.append(attempt.id)
                        await self.dialect.notify_cancel(conn, attempt.id)
                if cancelled:
                    await self._audit(conn, action, "cancel requested")
        except OncelyError as exc:
            if not self.dialect.is_busy(exc.__cause__ or exc):
                raise
            raise _write_locked("attempt") from None
        return cancelled

    # -- tasks --------------------------------------------------------------------------

    async def _task_refused(self, action: Action, task_id: int, what: str, allowed: str) -> None:
        rows = await self.db.read(task_queue_sql.get(task_id))
        if not rows:
            raise BadInputError(f"no task with id {task_id}")
        rec = record(rows[0])
        error = TaskStateError(
            f"task {task_id} ({rec.task}) is {rec.state.value}: only {allowed} tasks can be {what}"
        )
        await self.refused(action, error)
        raise error

    async def cancel_task(self, action: Action, task_id: int) -> tuple[str, TaskRecord | None]:
        """Cancel a task: one that is not running is discarded (`discarded`, its record); a
        running one gets a cancel request its worker acts on (`cancel requested`)."""
        await self._need()
        now = self.dialect.now()
        error = f"Cancelled: by {action.actor} (oncely tasks cancel)"
        async with self._write() as conn:
            row = (await conn.execute(sql.discard_unstarted(task_id, now, error))).first()
            if row is not None:
                await self._audit(conn, action, "discarded (it had not started)")
                return "discarded", record(row)
            asked = (
                await conn.execute(sql.request_task_cancel(task_id, now, action.actor))
            ).first()
            if asked is not None:
                await self._audit(conn, action, "cancel requested (running)")
                return "cancel requested", None
        rows = await self.db.read(sql.task_cancel_request(task_id))
        if rows:
            raise BadInputError(
                f"task {task_id} already has a cancel request (by {rows[0].requested_by} at "
                f"{rows[0].requested_at.isoformat(timespec='seconds')}): nothing changed"
            )
        await self._task_refused(action, task_id, "cancelled", "available or running")
        raise AssertionError("unreachable")  # pragma: no cover

    async def cancel_requested(
        self, ids: Sequence[int], engine: AsyncEngine | None = None
    ) -> set[int]:
        """Which of these (running) tasks an operator asked to cancel: for a worker's cancel
        watch, on its own control connection (`engine`; else the store's). Empty on a
        database without the control plane's tables."""
        if not ids or not self.db.has_control:
            return set()
        stmt = sql.task_cancel_requests(list(ids))
        if engine is None:
            return {int(r[0]) for r in await self.db.read(stmt)}
        with self.db.translate():
            async with engine.connect() as conn:
                return {int(r[0]) for r in await conn.execute(stmt)}

    async def task_cancel_request(self, task_id: int) -> tuple[datetime, str] | None:
        """When and by whom a task's cancel was asked for, if it was."""
        await self._need()
        rows = await self.db.read(sql.task_cancel_request(task_id))
        return (rows[0].requested_at, rows[0].requested_by) if rows else None

    async def retry_task(self, action: Action, task_id: int) -> TaskRecord:
        """Run a dead, discarded or waiting task again now, with its audit row."""
        await self._need()
        async with self._write() as conn:
            row = (
                await conn.execute(task_queue_sql.retry_now(task_id, self.dialect.now()))
            ).first()
            if row is not None:
                await conn.execute(sql.forget_task_cancel(task_id))
                await self._audit(conn, action, "available now")
                await self.dialect.notify_tasks(conn)
                return record(row)
        await self._task_refused(action, task_id, "retried", "dead, discarded or available")
        raise AssertionError("unreachable")  # pragma: no cover

    async def discard_task(self, action: Action, task_id: int) -> TaskRecord:
        """Discard a task that has not succeeded, with its audit row."""
        await self._need()
        async with self._write() as conn:
            row = (await conn.execute(task_queue_sql.discard(task_id, self.dialect.now()))).first()
            if row is not None:
                await self._audit(conn, action, "discarded")
                return record(row)
        await self._task_refused(action, task_id, "discarded", "available, running or dead")
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the trail and retention --------------------------------------------------------

    async def audit(self, job: str | None, limit: int) -> list[AuditEntry]:
        """The audit trail, newest first."""
        await self._need()
        return [audit_from_row(r) for r in await self.db.read(sql.audit_trail(job, limit))]

    async def prune(self, action: Action, before: datetime) -> dict[str, int]:
        """Delete finished tasks, claims, attempt records and ended pauses older than
        `before`; how many of each. Tasks and claims go first, in bounded batches of a
        transaction each (see `TaskQueue.prune`); the rest, with the audit row that counts
        it all, in one transaction."""
        await self._need()
        counts: dict[str, int] = {}
        counts["tasks"], counts["claims"] = await self.tasks.prune(before)
        async with self._write() as conn:
            statements = [
                ("attempts", sql.prune_attempts(before)),
                ("pauses", sql.prune_pauses(before)),
                ("cancel requests", sql.prune_task_cancels()),
            ]
            if self.db.has_duplicates:
                statements.append(("duplicates", sql.prune_duplicates(before)))
            for name, stmt in statements:
                counts[name] = int((await conn.execute(stmt)).rowcount or 0)
            await self._audit(conn, action, ", ".join(f"{n} {k}" for k, n in counts.items()))
        return counts


def _write_locked(what: str) -> BadInputError:
    return BadInputError(
        f"a running {what} holds SQLite's write lock until it ends, so a cancel cannot be "
        "recorded: nothing changed (stop the process running it: SIGTERM rolls it back)"
    )
