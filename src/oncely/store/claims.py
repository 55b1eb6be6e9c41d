"""The bare claim, on a caller's own transaction: the primitive everything else rests on."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from ..errors import DatabaseError, SchemaMissingError
from ..identity import replica_id
from . import dialect_for, postgres
from .dialect import MISSING_TABLES, Dialect


def _raise_translated(dialect: Dialect, exc: Exception) -> None:
    if dialect.is_missing_table(exc):
        raise SchemaMissingError(MISSING_TABLES) from exc
    raise DatabaseError(f"claiming failed: {getattr(exc, 'orig', None) or exc}") from exc


def _params(dialect: Dialect, job: str, key: str) -> dict[str, Any]:
    return {
        "job": job,
        "key": key,
        "scheduled_for": None,
        "claimed_by": replica_id(),
        **dialect.now_params(),
    }


async def claim_run(session: AsyncSession | AsyncConnection | Any, job: str, key: str) -> bool:
    """Claim (job, key) in the caller's open transaction; True if the claim is ours.

    One `INSERT … ON CONFLICT DO NOTHING RETURNING 1`: the claim commits with the caller's
    work or not at all, and a rollback frees it. If another transaction holds an uncommitted
    claim on the same key, this waits for it to end (use `Oncely.run` for a non-blocking try).
    `session` is an AsyncSession, an AsyncConnection, or a bare asyncpg connection, which
    must be inside a transaction (`async with conn.transaction():`).
    """
    if postgres.is_driver_connection(session):
        return await postgres.claim_on_driver(session, job, key, replica_id())
    if isinstance(session, AsyncSession):
        dialect = dialect_for((await session.connection()).dialect.name)
    else:
        dialect = dialect_for(session.dialect.name)
    try:
        row = (await session.execute(dialect.claim_statement, _params(dialect, job, key))).first()
    except DBAPIError as exc:
        _raise_translated(dialect, exc)
    return row is not None


def claim_run_sync(session: Session | Connection, job: str, key: str) -> bool:
    """The same claim as `claim_run`, for a synchronous Session or Connection (Django, Flask,
    scripts)."""
    bind = session.connection() if isinstance(session, Session) else session
    dialect = dialect_for(bind.dialect.name)
    try:
        row = session.execute(dialect.claim_statement, _params(dialect, job, key)).first()
    except DBAPIError as exc:
        _raise_translated(dialect, exc)
    return row is not None
