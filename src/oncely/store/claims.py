"""The bare claim, on a caller's own transaction: the primitive everything else rests on."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from ..errors import DatabaseError, SchemaMissingError
from ..identity import replica_id
from . import dialect_for
from .dialect import Dialect


def _raise_translated(dialect: Dialect, exc: DBAPIError) -> None:
    if dialect.is_missing_table(exc):
        raise SchemaMissingError(
            "oncely's tables are missing: run `oncely migrate` (or include "
            "oncely.schema.metadata in your migrations)"
        ) from exc
    raise DatabaseError(f"claiming failed: {exc.orig or exc}") from exc


def _params(dialect: Dialect, job: str, key: str) -> dict[str, Any]:
    return {
        "job": job,
        "key": key,
        "scheduled_for": None,
        "claimed_by": replica_id(),
        **dialect.now_params(),
    }


async def claim_run(session: AsyncSession, job: str, key: str) -> bool:
    """Claim (job, key) in the caller's open transaction; True if the claim is ours.

    One `INSERT … ON CONFLICT DO NOTHING RETURNING 1`: the claim commits with the caller's
    work or not at all, and a rollback frees it. If another transaction holds an uncommitted
    claim on the same key, this waits for it to end (use `Oncely.run` for a non-blocking try).
    """
    conn = await session.connection()
    dialect = dialect_for(conn.dialect.name)
    try:
        row = (await session.execute(dialect.claim_statement, _params(dialect, job, key))).first()
    except DBAPIError as exc:
        _raise_translated(dialect, exc)
    return row is not None


def claim_run_sync(session: Session, job: str, key: str) -> bool:
    """The same claim as `claim_run`, for a synchronous Session (Django, Flask, scripts)."""
    dialect = dialect_for(session.connection().dialect.name)
    try:
        row = session.execute(dialect.claim_statement, _params(dialect, job, key)).first()
    except DBAPIError as exc:
        _raise_translated(dialect, exc)
    return row is not None
