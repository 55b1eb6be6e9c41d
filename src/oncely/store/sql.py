"""Every statement oncely runs against its tables, named, each with its one purpose.

Statements that read the same on both databases are SQLAlchemy Core here; the few whose
text differs (the claim's conflict clause, locks, database time) come from the dialect
files `postgres.py` and `sqlite.py`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.dml import Insert

from .tables import UTCDateTime, runs, schema_versions

NOW = sa.bindparam("now", type_=UTCDateTime())
"""Database time as a bound value, for a database with no clock of its own (SQLite)."""


# The claim and the finish are built once per database (Dialect.claim_statement,
# Dialect.finish_statement) and executed with parameters: building a Core statement and its
# cache key costs 100-170 µs of CPU, more than the rest of a claim.


def claim_bound(insert: Any, now: Any) -> Insert:
    """Claim (job, key): insert the ledger row unless it exists; RETURNING 1 if it is ours.

    Bound parameters :job, :key, :scheduled_for, :claimed_by (and :now if `now` is NOW).
    """
    stmt: Insert = (
        insert(runs)
        .values(
            job=sa.bindparam("job", type_=runs.c.job.type),
            key=sa.bindparam("key", type_=runs.c.key.type),
            scheduled_for=sa.bindparam("scheduled_for", type_=runs.c.scheduled_for.type),
            claimed_at=now,
            claimed_by=sa.bindparam("claimed_by", type_=runs.c.claimed_by.type),
        )
        .on_conflict_do_nothing()
        .returning(sa.literal(1))
    )
    return stmt


def finish_bound(now: Any) -> sa.Update:
    """Stamp the end of a run on its claim, just before the commit.

    Bound parameters :claim_job, :claim_key (and :now if `now` is NOW).
    SQLAlchemy reserves the column names (:job, :key) for an UPDATE's SET clause.
    """
    return (
        sa.update(runs)
        .where(runs.c.job == sa.bindparam("claim_job"), runs.c.key == sa.bindparam("claim_key"))
        .values(finished_at=now)
    )


def get_claim(job: str, key: str) -> sa.Select[Any]:
    """The claim of one slot, if any."""
    return sa.select(runs).where(runs.c.job == job, runs.c.key == key)


def history(job: str | None, limit: int) -> sa.Select[Any]:
    """Claims, newest first, of one job or of all."""
    stmt = sa.select(runs).order_by(runs.c.claimed_at.desc(), runs.c.job, runs.c.key)
    if job is not None:
        stmt = stmt.where(runs.c.job == job)
    return stmt.limit(limit)


def last_claims() -> sa.Select[Any]:
    """The newest claim of each job."""
    newest = (
        sa.select(runs.c.job, sa.func.max(runs.c.claimed_at).label("claimed_at"))
        .group_by(runs.c.job)
        .subquery()
    )
    return sa.select(runs).join(
        newest, sa.and_(runs.c.job == newest.c.job, runs.c.claimed_at == newest.c.claimed_at)
    )


def last_slots() -> sa.Select[Any]:
    """The newest claimed slot time of each job: where the worker's catch-up looks back from."""
    return sa.select(runs.c.job, sa.func.max(runs.c.scheduled_for).label("slot")).group_by(
        runs.c.job
    )


def release(job: str, key: str) -> Any:
    """Delete one claim so its slot can run again; RETURNING the row that was there."""
    return sa.delete(runs).where(runs.c.job == job, runs.c.key == key).returning(*runs.c)


def claim_count(job: str) -> sa.Select[Any]:
    """How many claims a job has."""
    return sa.select(sa.func.count()).select_from(runs).where(runs.c.job == job)


def rename_claims(old: str, new: str) -> sa.Update:
    """Carry a job's claims to a new name, except keys the new name already has."""
    taken = sa.select(runs.c.key).where(runs.c.job == new).scalar_subquery()
    return sa.update(runs).where(runs.c.job == old, runs.c.key.not_in(taken)).values(job=new)


def clear() -> sa.Delete:
    """Delete every claim (test databases only)."""
    return sa.delete(runs)


def schema_version() -> sa.Select[Any]:
    """The newest applied migration."""
    return sa.select(sa.func.max(schema_versions.c.version))


def record_version(version: int, now: Any) -> sa.Insert:
    """Mark one migration as applied."""
    return sa.insert(schema_versions).values(version=version, applied_at=now)
