"""Which Dialect serves a database: by SQLAlchemy's name for it, or by a bare driver connection."""

from __future__ import annotations

from ..errors import BadInputError
from .dialect import Dialect
from .postgres import PostgresDialect
from .sqlite import SQLiteDialect

# Dialects hold no per-engine state; sharing one per database shares its prebuilt statements.
_DIALECTS: dict[str, Dialect] = {"postgresql": PostgresDialect(), "sqlite": SQLiteDialect()}


def dialect_for(name: str) -> Dialect:
    """The Dialect for a SQLAlchemy dialect name."""
    dialect = _DIALECTS.get(name)
    if dialect is None:
        raise BadInputError(f"oncely supports Postgres and SQLite, not {name!r}")
    return dialect


def driver_dialect(conn: object) -> Dialect | None:
    """The Dialect whose driver `conn` is a bare connection of (asyncpg), or None: `conn` is
    SQLAlchemy's (a Session, a Connection)."""
    for dialect in _DIALECTS.values():
        if dialect.owns_connection(conn):
            return dialect
    return None
