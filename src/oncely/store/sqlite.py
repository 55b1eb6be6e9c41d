"""SQLite: the database's single write lock stands in for the slot lock.

SQLite has one writer at a time. An attempt opens with `BEGIN IMMEDIATE`, which takes the
write lock at once or reports the database busy after a short wait: a loser never queues
behind a running job. Engines oncely builds get WAL mode (readers never block the writer)
and explicit transaction control; the stdlib driver's own implicit BEGIN is turned off.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import registry, sqlite
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from .. import clock
from . import sql
from .dialect import ClaimAnswer, ClaimRequest, Dialect
from .plan import run_async

BUSY_MS_OPTION = "oncely_busy_ms"
"""Execution option: how long BEGIN IMMEDIATE may wait for the write lock, in milliseconds."""
DEFAULT_BUSY_MS = 5000
READ_ONLY_OPTION = "oncely_read_only"
"""Execution option: open a plain (deferred) transaction, for reads that must not queue."""
DEFERRED_OPTION = "oncely_deferred"
"""Execution option: open a deferred transaction, which takes the write lock at its first
write (a task's: it holds the lock from its first write to its commit, not from its start)."""


WAL_PRAGMA = "PRAGMA journal_mode=WAL"


def _wal_waits() -> Iterator[float]:
    """The pauses between tries of WAL_PRAGMA, doubling from 1 ms, for DEFAULT_BUSY_MS in all.

    Turning a database into WAL mode takes an exclusive lock, and SQLite does not call its
    busy handler for that lock: a connection opened while another one writes or converts
    the same new file gets "database is locked" at once, whatever busy_timeout says."""
    deadline = time.monotonic() + DEFAULT_BUSY_MS / 1000
    pause = 0.001
    while time.monotonic() + pause < deadline:
        yield pause
        pause = min(pause * 2, 0.05)


def _is_busy(exc: BaseException) -> bool:
    text = str(exc)
    return "database is locked" in text or "database table is locked" in text


def _enable_wal(dbapi_connection: Any) -> None:
    for pause in _wal_waits():
        try:
            dbapi_connection.execute(WAL_PRAGMA).close()
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise
            time.sleep(pause)  # a sync engine's own thread: nothing else waits on it
    dbapi_connection.execute(WAL_PRAGMA).close()  # the last try: its error is the caller's


async def _enable_wal_async(driver_connection: Any) -> None:
    for pause in _wal_waits():
        try:
            await (await driver_connection.execute(WAL_PRAGMA)).close()
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise
            await asyncio.sleep(pause)  # lets this loop's other connections finish
    await (await driver_connection.execute(WAL_PRAGMA)).close()


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
    run_async = getattr(dbapi_connection, "run_async", None)  # aiosqlite's adapted connection
    if run_async is not None:
        run_async(_enable_wal_async)
    else:
        _enable_wal(dbapi_connection)
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _on_begin(conn: Connection) -> None:
    busy_ms = int(conn.get_execution_options().get(BUSY_MS_OPTION, DEFAULT_BUSY_MS))
    if conn.info.get(BUSY_MS_OPTION) != busy_ms:
        conn.exec_driver_sql(f"PRAGMA busy_timeout = {busy_ms:d}")
        conn.info[BUSY_MS_OPTION] = busy_ms
    options = conn.get_execution_options()
    deferred = options.get(READ_ONLY_OPTION, False) or options.get(DEFERRED_OPTION, False)
    conn.exec_driver_sql("BEGIN" if deferred else "BEGIN IMMEDIATE")


def _on_reset(dbapi_connection: Any, record: Any, state: Any) -> None:
    # The engine has pool_reset_on_return=None: by default SQLAlchemy rolls back every
    # connection handed back to the pool, even after a commit, and on aiosqlite that rollback
    # is one more thread hop per attempt (~8% of app.run). Roll back only what is still open.
    if state.terminate_only or not state.asyncio_safe or state.transaction_was_reset:
        return
    driver = getattr(record, "driver_connection", None)
    if driver is None or getattr(driver, "in_transaction", True):
        dbapi_connection.rollback()


def _as_text(_cursor: Any, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row with the datetimes a connection's converters made turned back into SQLite's
    text for them (what SQLAlchemy's DateTime reads)."""
    return tuple(v.isoformat(" ") if isinstance(v, datetime) else v for v in row)


# SQLAlchemy's stdlib driver for a connection oncely borrows (store/borrowed.py), without its
# connect hook: its REGEXP and floor() would replace the owner's (Django registers its own).
LENT_PYSQLITE = "oncely_lent_pysqlite"


class LentPysqlite(SQLiteDialect_pysqlite):
    supports_statement_cache = True

    def on_connect(self) -> None:  # type: ignore[override]
        return None


registry.register(f"sqlite.{LENT_PYSQLITE}", __name__, "LentPysqlite")


class SQLiteDialect(Dialect):
    name = "sqlite"

    def engine_options(self) -> dict[str, Any]:
        return {"pool_reset_on_return": None}  # see _on_reset

    def configure_engine(
        self, engine: AsyncEngine, *, ping_after_idle: float | None = None
    ) -> None:
        self.configure_sync_engine(engine.sync_engine)
        event.listen(engine.sync_engine.pool, "reset", _on_reset)

    def configure_sync_engine(self, engine: Engine) -> None:
        event.listen(engine, "connect", _on_connect)
        event.listen(engine, "begin", _on_begin)

    def sync_driver(self) -> str:
        return "sqlite"

    def read_only_options(self) -> dict[str, Any]:
        return {READ_ONLY_OPTION: True}

    def busy_options(self, busy_ms: int) -> dict[str, Any]:
        return {BUSY_MS_OPTION: busy_ms}

    def insert(self) -> Any:
        return sqlite.insert

    def now(self) -> Any:
        # SQLite has no server clock of its own: "database time" is this machine's.
        return clock.utcnow()

    def now_sql(self) -> Any:
        return sql.NOW

    def now_params(self) -> dict[str, Any]:
        return {"now": clock.utcnow()}

    async def lock_and_claim(self, session: AsyncSession, request: ClaimRequest) -> ClaimAnswer:
        # `exclusive` needs nothing more here: the write lock already lets one attempt at a
        # time run, whatever its job, so two slots of a job never run at once.
        try:
            # The first use of the session opens its transaction: BEGIN IMMEDIATE, waiting
            # at most busy_ms for the write lock (see _on_begin).
            await session.connection(execution_options={BUSY_MS_OPTION: request.busy_ms})
            return await run_async(session, self.lock_and_claim_plan(request))
        except sa.exc.OperationalError as exc:
            if self.is_busy(exc):
                return ClaimAnswer.BUSY
            raise

    # migration_lock: none, BEGIN IMMEDIATE already serializes writers.

    def foreign_driver(self, dbapi_connection: object) -> str:
        return LENT_PYSQLITE

    def foreign_cursor(self, cursor: Any) -> Any:
        # Django's connection parses declared DATETIME columns itself (detect_types); hand
        # SQLAlchemy the text it parses, as the stdlib driver returns it by default.
        cursor.row_factory = _as_text
        return cursor

    def is_missing_table(self, exc: BaseException) -> bool:
        return "no such table: oncely_" in str(exc)

    def epoch_minute(self, column: Any) -> Any:
        # Instants are stored as naive UTC text: strftime reads them as UTC.
        return sa.cast(sa.func.strftime("%s", column), sa.Integer) // 60

    def is_unavailable(self, exc: BaseException) -> bool:
        return "unable to open database file" in str(exc)

    # try_lock_slot: the write transaction's BEGIN IMMEDIATE already excludes every attempt
    # (a running one makes it busy, see Store.release).

    def is_read_only(self, exc: BaseException) -> bool:
        return "readonly database" in str(exc)

    def is_schema_problem(self, exc: BaseException) -> bool:
        text = str(exc)
        return ("no such column" in text or "has no column named" in text) or (
            "no such table" in text and not self.is_missing_table(exc)
        )

    async def probe_writes(self, conn: AsyncConnection) -> None:
        # A write that matches no row still needs a writable file (an immutable or read-only
        # one answers SQLITE_READONLY); another writer holding the lock means it is writable.
        try:
            await conn.exec_driver_sql("DELETE FROM oncely_schema WHERE 1 = 0")
        except sa.exc.OperationalError as exc:
            if not (self.is_busy(exc) or self.is_missing_table(exc)):
                raise
        finally:
            await conn.rollback()

    def is_busy(self, exc: BaseException) -> bool:
        return _is_busy(exc)

    def task_options(self, *, eager: bool) -> dict[str, Any]:
        return {DEFERRED_OPTION: not eager}

    def is_conflict(self, exc: BaseException) -> bool:
        # "database is locked": the write lock stayed taken for the whole busy timeout, or a
        # deferred transaction that read first found the database changed since its read
        # (SQLITE_BUSY_SNAPSHOT, which the busy timeout does not wait out).
        seen: BaseException | None = exc
        for _ in range(5):
            if seen is None:
                return False
            if _is_busy(seen):
                return True
            seen = getattr(seen, "orig", None) or seen.__cause__
        return False
