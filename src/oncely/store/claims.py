"""The bare claim, on a caller's own transaction: the primitive everything else rests on.

The claim, the read of a claim and the stamp of a run's end are each written once, as a plan
(see `plan`), and run on synchronous and asynchronous sessions alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from ..errors import DatabaseError, SchemaMissingError
from ..identity import replica_id
from ..model import Claim
from . import sql
from .dialect import MISSING_TABLES, Dialect
from .dialects import dialect_for, driver_dialect
from .plan import Plan, run, run_async


def raise_translated(dialect: Dialect, exc: Exception) -> NoReturn:
    """A driver error of a statement oncely sent in the caller's transaction, as an
    OncelyError (SchemaMissingError for a missing table, else DatabaseError)."""
    if dialect.is_missing_table(exc):
        raise SchemaMissingError(MISSING_TABLES) from exc
    raise DatabaseError(f"claiming failed: {getattr(exc, 'orig', None) or exc}") from exc


def claim_from_row(row: Any) -> Claim:
    """An oncely_runs row as a Claim."""
    return Claim(
        job=row.job,
        key=row.key,
        scheduled_for=row.scheduled_for,
        claimed_at=row.claimed_at,
        claimed_by=row.claimed_by,
        finished_at=row.finished_at,
    )


def claim_plan(dialect: Dialect, job: str, key: str, claimed_by: str) -> Plan[bool]:
    """Claim (job, key) in the open transaction; True if the claim is ours."""
    params = {
        "job": job,
        "key": key,
        "scheduled_for": None,
        "claimed_by": claimed_by,
        **dialect.now_params(),
    }
    row = (yield dialect.claim_statement, params).first()
    return row is not None


def claim_in_plan(job: str, key: str) -> Plan[Claim | None]:
    """The claim of (job, key) as the open transaction sees it."""
    row = (yield sql.get_claim(job, key), None).first()
    return claim_from_row(row) if row is not None else None


def finish_plan(dialect: Dialect, job: str, key: str) -> Plan[None]:
    """Stamp the end of the run claimed as (job, key), before its commit."""
    yield dialect.finish_statement, {"claim_job": job, "claim_key": key, **dialect.now_params()}


def fate_plan(
    dialect: Dialect, job: str, key: str, record: Callable[[int, Any], tuple[Any, Any]]
) -> Plan[None]:
    """A failed attempt's end, while its transaction still holds the slot: roll its work back
    to the savepoint taken after the claim, drop its claim, and write `record(tries, now)`
    (the statement of its end row, given how many marked attempts the slot had so far and
    database now). The caller commits."""
    yield sql.ROLLBACK_TO_SAVEPOINT, None
    yield sql.unclaim(job, key), None
    marks = (yield sql.slot_marks(job, key, dialect.now()), None).one()
    yield record(int(marks.tries), marks.now)


async def claim_run(session: AsyncSession | AsyncConnection | Any, job: str, key: str) -> bool:
    """Claim (job, key) in the caller's open transaction; True if the claim is ours.

    One `INSERT … ON CONFLICT DO NOTHING RETURNING 1`: the claim commits with the caller's
    work or not at all, and a rollback frees it. If another transaction holds an uncommitted
    claim on the same key, this waits for it to end (use `Oncely.run` for a non-blocking try).
    `session` is an AsyncSession, an AsyncConnection, or a bare asyncpg connection, which
    must be inside a transaction (`async with conn.transaction():`). On an AsyncSession over
    asyncpg the INSERT goes straight to the session's driver connection, in its transaction.
    """
    driver = driver_dialect(session)
    if driver is not None:
        return await driver.claim_on_driver(session, job, key, replica_id())
    if isinstance(session, AsyncSession):
        bind = await session.connection()
        dialect = dialect_for(bind.dialect.name)
        on_driver = await dialect.session_driver(session, bind)
        if on_driver is not None and on_driver.is_in_transaction():
            # The prepared INSERT on the session's driver connection, in its transaction.
            return await dialect.claim_on_driver(on_driver, job, key, replica_id())
    else:
        dialect = dialect_for(session.dialect.name)
    try:
        return await run_async(session, claim_plan(dialect, job, key, replica_id()))
    except DBAPIError as exc:
        raise_translated(dialect, exc)


def claim_run_sync(session: Session | Connection, job: str, key: str) -> bool:
    """The same claim as `claim_run`, for a synchronous Session or Connection (Django, Flask,
    scripts)."""
    bind = session.connection() if isinstance(session, Session) else session
    dialect = dialect_for(bind.dialect.name)
    try:
        return run(session, claim_plan(dialect, job, key, replica_id()))
    except DBAPIError as exc:
        raise_translated(dialect, exc)
