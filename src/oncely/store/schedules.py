"""Schedules kept as data: their statements, and the operations on oncely_schedules.

Every change is a compare-and-set on the row (its `version`, or its `state`), written in one
transaction with its audit row; a pause or a resume also opens or ends the pause of the
schedule's ledger name in oncely_pauses, so that its slots have the pause rules, `explain`
and `verify` of a code job's. The scheduler finds the due schedules by the partial index on
`next_slot` (active rows only) and moves a schedule's `next_slot` on with a compare-and-set
on the value it read, so a change made meanwhile wins.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import ScheduleError, SchemaMissingError, UnknownScheduleError
from ..model import Claim, ScheduleRecord
from . import sql
from .control import Action, write_audit
from .database import Database
from .rows import claim_from_row
from .tables import jobs, runs, schedules

LEDGER_PREFIX = "schedule:"
"""A data schedule's slots are claimed in oncely_runs under this prefix and its name."""


# -- statements ---------------------------------------------------------------------------


def insert_schedule(insert: Any, values: dict[str, Any]) -> Any:
    """Add a schedule unless one of that name exists; RETURNING it (no row: it exists)."""
    return (
        insert(schedules)
        .values(**values)
        .on_conflict_do_nothing(index_elements=[schedules.c.name])
        .returning(*schedules.c)
    )


def get_schedule(name: str) -> sa.Select[Any]:
    """One schedule by name."""
    return sa.select(schedules).where(schedules.c.name == name)


def all_schedules(after: str | None, limit: int | None) -> sa.Select[Any]:
    """The schedules by name (those after `after`, at most `limit`)."""
    stmt = sa.select(schedules).order_by(schedules.c.name)
    if after is not None:
        stmt = stmt.where(schedules.c.name > after)
    return stmt.limit(limit) if limit is not None else stmt


def change_schedule(name: str, version: int, values: dict[str, Any]) -> Any:
    """Change a schedule if it is still at `version` (bumped); RETURNING it."""
    return (
        sa.update(schedules)
        .where(schedules.c.name == name, schedules.c.version == version)
        .values(version=schedules.c.version + 1, **values)
        .returning(*schedules.c)
    )


def confirm_version(name: str, version: int) -> Any:
    """Touch a schedule iff it is still at `version`, changing nothing: an edit that changes
    no field, ordered against the changes of others (its row lock; SQLite's write lock)."""
    return (
        sa.update(schedules)
        .where(schedules.c.name == name, schedules.c.version == version)
        .values(version=schedules.c.version)
    )


def set_state(name: str, expected: str, values: dict[str, Any]) -> Any:
    """Pause or resume a schedule if it is in the `expected` state; RETURNING it."""
    return (
        sa.update(schedules)
        .where(schedules.c.name == name, schedules.c.state == expected)
        .values(version=schedules.c.version + 1, **values)
        .returning(*schedules.c)
    )


def delete_schedule(name: str) -> Any:
    """Remove a schedule; RETURNING it."""
    return sa.delete(schedules).where(schedules.c.name == name).returning(*schedules.c)


def due(now: datetime, limit: int) -> sa.Select[Any]:
    """The active schedules whose next slot is at or before `now`, earliest first: a range
    of the partial index oncely_schedules_due."""
    return (
        sa.select(schedules)
        .where(schedules.c.state == "active", schedules.c.next_slot <= now)
        .order_by(schedules.c.next_slot)
        .limit(limit)
    )


def next_slot_of(name: str) -> sa.Select[Any]:
    """A schedule's next slot, if it is active."""
    return sa.select(schedules.c.next_slot).where(
        schedules.c.name == name, schedules.c.state == "active"
    )


def next_due() -> sa.Select[Any]:
    """The earliest next slot of any active schedule (the first entry of the index)."""
    return sa.select(sa.func.min(schedules.c.next_slot)).where(schedules.c.state == "active")


def advance(name: str, expected: datetime, new: datetime | None) -> sa.Update:
    """Move a schedule's next slot on from the one the scheduler read, unless a change
    moved it meanwhile (compare-and-set on the value)."""
    return (
        sa.update(schedules)
        .where(schedules.c.name == name, schedules.c.next_slot == expected)
        .values(next_slot=new)
    )


def lease_due(now: datetime, limit: int, replica: str, until: datetime) -> Any:
    """Lease up to `limit` due active schedules to `replica` until `until`, earliest first:
    rows another worker holds (locked by its read or its attempt, or leased and not expired)
    are skipped (FOR UPDATE SKIP LOCKED), so one worker at a time attempts a due row."""
    free = sa.or_(schedules.c.leased_until.is_(None), schedules.c.leased_until <= now)
    picked = (
        sa.select(schedules.c.name)
        .where(schedules.c.state == "active", schedules.c.next_slot <= now, free)
        .order_by(schedules.c.next_slot)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("picked")
    )
    return (
        sa.update(schedules)
        .where(schedules.c.name == picked.c.name)
        .values(leased_until=until, leased_by=replica)
        .returning(*schedules.c)
    )


def renew_leases(names: list[str], replica: str, until: datetime) -> sa.Update:
    """Extend the leases `replica` holds on schedules it is still attempting."""
    return (
        sa.update(schedules)
        .where(schedules.c.name.in_(names), schedules.c.leased_by == replica)
        .values(leased_until=until)
    )


def release_leases(names: list[str], replica: str) -> sa.Update:
    """End the leases `replica` holds on schedules it is done with (or did not start)."""
    return (
        sa.update(schedules)
        .where(schedules.c.name.in_(names), schedules.c.leased_by == replica)
        .values(leased_until=None, leased_by=None)
    )


def last_claims(prefix: str) -> sa.Select[Any]:
    """The newest claim of each schedule: per schedule, one lookup of the index
    oncely_runs_job_claimed_at (its newest `claimed_at`, then that row), however long the
    ledger; removed schedules' claims are not read."""
    job = sa.literal(prefix) + schedules.c.name
    other = runs.alias("newest")
    newest = (
        sa.select(sa.func.max(other.c.claimed_at))
        .where(other.c.job == job)
        .correlate(schedules)
        .scalar_subquery()
    )
    return (
        sa.select(runs)
        .select_from(schedules)
        .join(runs, sa.and_(runs.c.job == job, runs.c.claimed_at == newest))
    )


def counts() -> sa.Select[Any]:
    """How many schedules there are, and how many of them are paused."""
    paused = sa.case((schedules.c.state == "paused", 1), else_=0)
    return sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(paused), 0)).select_from(
        schedules
    )


def forget_first_seen(name: str) -> sa.Delete:
    """Drop the recorded first appearance of a ledger name (a schedule added anew, or whose
    expression or zone changed: `verify` expects its slots from then on)."""
    return sa.delete(jobs).where(jobs.c.name == name)


def ledger_name(name: str) -> str:
    """The job name a schedule's slots are claimed under in oncely_runs."""
    return f"{LEDGER_PREFIX}{name}"


def record(row: Any) -> ScheduleRecord:
    """A row of oncely_schedules as the value the API hands out."""
    return ScheduleRecord(
        name=row.name,
        cron=row.cron,
        every=row.every_seconds,
        tz=row.tz,
        target_kind=row.target_kind,
        target=row.target,
        args=json.loads(row.args),
        catch_up=row.catch_up,
        grace=row.grace_seconds,
        overlap=row.overlap,
        timeout=row.timeout_seconds,
        state=row.state,
        pause_reason=row.pause_reason,
        version=int(row.version),
        created_at=row.created_at,
        changed_at=row.changed_at,
        changed_by=row.changed_by,
        next_slot=row.next_slot,
        ledger_name=ledger_name(row.name),
    )


# -- operations ---------------------------------------------------------------------------


class ScheduleStore:
    """The operations on oncely_schedules, each change with its audit row."""

    def __init__(self, store: Database) -> None:
        self.store = store
        self.dialect = store.dialect

    async def _need(self) -> None:
        await self.store.ensure_schema()
        if not self.store.has_schedules:
            raise SchemaMissingError(
                f"oncely's tables in {self.store.display_url} predate schedules kept as data: "
                "run `oncely migrate`"
            )

    @contextlib.asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        with self.store.translate():
            async with self.store.engine.begin() as conn:
                yield conn

    async def _first_seen(self, conn: AsyncConnection, name: str) -> None:
        """Date the schedule's expected slots from this change (see `forget_first_seen`)."""
        job = ledger_name(name)
        await conn.execute(forget_first_seen(job))
        await conn.execute(sql.record_jobs(self.dialect.insert(), [job], self.dialect.now()))

    async def _audit(self, conn: AsyncConnection, action: Action, result: str) -> None:
        await write_audit(conn, self.dialect, action, result)

    async def get(self, name: str) -> ScheduleRecord:
        """One schedule; UnknownScheduleError if there is none of that name."""
        await self._need()
        rows = await self.store.read(get_schedule(name))
        if not rows:
            raise UnknownScheduleError(f"no schedule named {name!r}")
        return record(rows[0])

    async def listing(
        self, after: str | None = None, limit: int | None = None
    ) -> list[ScheduleRecord]:
        """The schedules by name, from after `after`, at most `limit` (none on a database
        older than schema 17)."""
        await self.store.ensure_schema()
        if not self.store.has_schedules:
            return []
        return [record(r) for r in await self.store.read(all_schedules(after, limit))]

    async def add(
        self, values: dict[str, Any], action: Action, result: str, *, paused: bool = False
    ) -> ScheduleRecord:
        """Insert a schedule with its audit row (`paused`: and the pause of its ledger name);
        ScheduleError if the name is taken."""
        await self._need()
        async with self._write() as conn:
            row = (await conn.execute(insert_schedule(self.dialect.insert(), values))).first()
            if row is None:
                raise ScheduleError(f"a schedule named {values['name']!r} exists already")
            await self._first_seen(conn, values["name"])
            if paused:
                job = ledger_name(values["name"])
                now = self.dialect.now()
                await conn.execute(sql.resume(job, now, action.actor))  # a stale pause, if any
                await conn.execute(sql.pause(job, now, action.actor, action.reason))
            await self._audit(conn, action, result)
        return record(row)

    async def change(
        self, name: str, version: int, values: dict[str, Any], action: Action, result: str
    ) -> ScheduleRecord:
        """Change a schedule read at `version`, with its audit row; ScheduleError if another
        change came first (nothing written)."""
        await self._need()
        async with self._write() as conn:
            row = (await conn.execute(change_schedule(name, version, values))).first()
            if row is None:
                await self._refuse_changed(conn, name)
            if "next_slot" in values:
                await self._first_seen(conn, name)
            await self._audit(conn, action, result)
        assert row is not None
        return record(row)

    async def confirm(self, name: str, version: int) -> None:
        """Check, in a write, that a schedule is still at `version` (an edit read at it that
        changes nothing); ScheduleError if another change came first."""
        await self._need()
        async with self._write() as conn:
            if not (await conn.execute(confirm_version(name, version))).rowcount:
                await self._refuse_changed(conn, name)

    async def _refuse_changed(self, conn: AsyncConnection, name: str) -> None:
        if (await conn.execute(get_schedule(name))).first() is None:
            raise UnknownScheduleError(f"no schedule named {name!r}")
        raise ScheduleError(f"schedule {name!r} was changed meanwhile: nothing changed, try again")

    async def pause(self, name: str, values: dict[str, Any], action: Action) -> ScheduleRecord:
        """Pause an active schedule and open the pause of its ledger name, with the audit
        row; ScheduleError if it is paused already."""
        await self._need()
        async with self._write() as conn:
            row = (await conn.execute(set_state(name, "active", values))).first()
            if row is None:
                await self._refuse_state(conn, name, "is paused already: nothing changed")
            job = ledger_name(name)
            now = self.dialect.now()
            await conn.execute(sql.resume(job, now, action.actor))  # a stale pause, if any
            await conn.execute(sql.pause(job, now, action.actor, action.reason))
            await self._audit(conn, action, "paused")
        assert row is not None
        return record(row)

    async def resume(self, name: str, values: dict[str, Any], action: Action) -> ScheduleRecord:
        """Resume a paused schedule and end the pause of its ledger name, with the audit
        row; ScheduleError if it is not paused."""
        await self._need()
        async with self._write() as conn:
            row = (await conn.execute(set_state(name, "paused", values))).first()
            if row is None:
                await self._refuse_state(conn, name, "is not paused: nothing to resume")
            await conn.execute(sql.resume(ledger_name(name), self.dialect.now(), action.actor))
            await self._audit(conn, action, "resumed")
        assert row is not None
        return record(row)

    async def _refuse_state(self, conn: AsyncConnection, name: str, why: str) -> None:
        if (await conn.execute(get_schedule(name))).first() is None:
            raise UnknownScheduleError(f"no schedule named {name!r}")
        raise ScheduleError(f"schedule {name!r} {why}")

    async def remove(self, name: str, action: Action) -> ScheduleRecord:
        """Delete a schedule (and end its pause, if any) with its audit row."""
        await self._need()
        async with self._write() as conn:
            row = (await conn.execute(delete_schedule(name))).first()
            if row is None:
                raise UnknownScheduleError(f"no schedule named {name!r}")
            await conn.execute(sql.resume(ledger_name(name), self.dialect.now(), action.actor))
            await self._audit(conn, action, "removed")
        return record(row)

    async def audited(self, action: Action, result: str) -> None:
        """Record an action whose own writes are elsewhere (a slot run by hand)."""
        await self._need()
        async with self._write() as conn:
            await self._audit(conn, action, result)

    # -- the scheduler's reads and writes ----------------------------------------------

    async def due(self, now: datetime, limit: int) -> list[ScheduleRecord]:
        """Up to `limit` active schedules whose next slot is at or before `now` (none on a
        database older than schema 17)."""
        if not self.store.has_schedules:
            return []
        # One statement, autocommitted where the database can: what an idle worker sends
        # every poll (one transaction, not a BEGIN, the read and a ROLLBACK).
        with self.store.translate():
            async with self.store.engine.connect() as conn:
                conn = await conn.execution_options(**self.dialect.record_options())
                return [record(r) for r in await conn.execute(due(now, limit))]

    @property
    def leasing(self) -> bool:
        """Whether due rows are leased at the read (Postgres, schema 19)."""
        return self.dialect.row_leases and self.store.has_schedule_leases

    async def take_due(
        self, now: datetime, limit: int, replica: str, until: datetime
    ) -> list[ScheduleRecord]:
        """The due schedules this worker may attempt: on Postgres leased to `replica` until
        `until` (rows another worker holds are skipped); on SQLite, whose single writer
        orders the attempts, read as they are (`due`)."""
        if not self.leasing:
            return await self.due(now, limit)
        with self.store.translate():
            async with self.store.engine.connect() as conn:
                conn = await conn.execution_options(**self.dialect.record_options())
                found = await conn.execute(lease_due(now, limit, replica, until))
                return [record(r) for r in found]

    async def renew(self, names: list[str], replica: str, until: datetime) -> None:
        """Extend `replica`'s leases on the schedules it is still attempting."""
        if names and self.leasing:
            async with self._write() as conn:
                await conn.execute(renew_leases(names, replica, until))

    async def release(self, names: list[str], replica: str) -> None:
        """End `replica`'s leases on `names`: other workers may attempt them at once."""
        if names and self.leasing:
            async with self._write() as conn:
                await conn.execute(release_leases(names, replica))

    async def still_due(self, name: str, expected: datetime) -> bool:
        """Whether a schedule's next slot is still the one read (no replica has moved it on
        since): one lookup by name, before an attempt that would otherwise find its slot
        claimed."""
        with self.store.translate():
            async with self.store.engine.connect() as conn:
                conn = await conn.execution_options(**self.dialect.record_options())
                found = (await conn.execute(next_slot_of(name))).first()
        return found is not None and found[0] == expected

    async def next_due(self) -> datetime | None:
        """The earliest next slot of any active schedule."""
        if not self.store.has_schedules:
            return None
        rows = await self.store.read(next_due())
        value = rows[0][0] if rows else None
        return value if isinstance(value, datetime) else None

    async def advance(self, name: str, expected: datetime, new: datetime | None) -> bool:
        """Move a schedule's next slot from `expected` to `new`; False if a change (or
        another replica) moved it meanwhile."""
        async with self._write() as conn:
            return bool((await conn.execute(advance(name, expected, new))).rowcount)

    async def last_claims(self) -> dict[str, Claim]:
        """The newest claim of each schedule that has one, by schedule name."""
        if not self.store.has_schedules:
            return {}
        rows = await self.store.read(last_claims(LEDGER_PREFIX))
        return {r.job[len(LEDGER_PREFIX) :]: claim_from_row(r) for r in rows}

    async def counts(self) -> tuple[int, int]:
        """(how many schedules, how many of them paused): two counts, no rows read out."""
        await self.store.ensure_schema()
        if not self.store.has_schedules:
            return 0, 0
        total, paused = (await self.store.read(counts()))[0]
        return int(total), int(paused)
