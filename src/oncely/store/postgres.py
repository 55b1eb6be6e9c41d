"""Postgres: advisory transaction locks for the slot, `now()` for database time."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import logging
import re
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import Any, ClassVar, NamedTuple, NoReturn

import asyncpg
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.util import await_only

from ..errors import BadInputError, ConfigError, DatabaseError, SchemaMissingError
from ..locks import job_lock_key, slot_lock_key
from . import sql
from .dialect import (
    MISSING_TABLES,
    ClaimOutcome,
    ClaimRequest,
    Dialect,
    checked_plan,
    marks_verdict,
)
from .plan import Plan, Step, run_async
from .session import attempt_driver, mark_claimed, mark_pause_read
from .tables import UTCDateTime

# The migration lock's two keys ("once", 0). Slot and job locks use the two-key form too,
# with all 64 bits from a hash (see oncely.locks), so they never meet an application's
# one-key (bigint) locks.
LOCK_NAMESPACE = 0x6F6E6365
_MIGRATION_LOCK = 0

# Lock and claim in one round trip: each lock CTE runs once (volatile, referenced twice);
# the job lock is only tried for an exclusive attempt; the insert runs only if the locks
# were ours; the row says which case we are in.
LOCK_AND_CLAIM = sa.text(
    """
    WITH lock AS (
        SELECT pg_try_advisory_xact_lock(:slot_hi, :slot_lo) AS got
    ), job_lock AS (
        SELECT CASE WHEN CAST(:exclusive AS boolean)
                    THEN pg_try_advisory_xact_lock(:job_hi, :job_lo)
                    ELSE true END AS got
    ), ins AS (
        INSERT INTO oncely_runs (job, key, scheduled_for, claimed_at, claimed_by)
        SELECT CAST(:job AS varchar), CAST(:key AS varchar),
               CAST(:scheduled_for AS timestamptz), now(), CAST(:claimed_by AS varchar)
        FROM lock, job_lock WHERE lock.got AND job_lock.got
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT (SELECT got FROM lock) AS got, (SELECT got FROM job_lock) AS job_free,
           (SELECT count(*) FROM ins) AS claimed
    """
).bindparams(sa.bindparam("scheduled_for", type_=UTCDateTime()))

# A pooled connection idle longer than this is pinged before use; a dead one is replaced
# without the caller seeing an error. SQLAlchemy's pool_pre_ping would ping on every checkout,
# which on asyncpg is three round trips (BEGIN; ; ROLLBACK) and more than doubled the cost of
# an attempt (4 round trips). A connection in steady use needs no ping: if the server went
# away within this window, the attempt fails like any attempt in flight during a restart.
PING_AFTER_IDLE_S = 2.0
PING_TIMEOUT_S = 10.0
_CHECKED_IN_AT = "oncely_checked_in_at"

_MISSING_TABLE = "42P01"  # undefined_table
_MISSING_COLUMN = "42703"  # undefined_column
_READ_ONLY = "25006"  # read_only_sql_transaction (a standby, default_transaction_read_only)
# SQLSTATEs that mean "no usable connection": connection exceptions, failed authentication,
# a database that does not exist, a server shutting down or starting, too many connections.
_UNAVAILABLE_PREFIXES = ("08", "28", "3D", "57P", "53300")


def _sqlstate(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", None)
    for candidate in (exc, orig, getattr(orig, "__cause__", None)):
        code = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if code:
            return str(code)
    return None


def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
    if record is not None:
        record.info[_CHECKED_IN_AT] = time.monotonic()


def _close_if_open(dbapi_connection: Any, _record: Any) -> None:
    driver = getattr(dbapi_connection, "driver_connection", None)
    if isinstance(driver, asyncpg.Connection) and driver.is_in_transaction():
        # A transaction begun on the driver (an attempt's, see `begin_attempt`) came back
        # open, which SQLAlchemy's reset cannot see. Close the socket: the server rolls the
        # transaction back, and the next checkout replaces the connection.
        driver.terminate()


def _refuse_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    driver = getattr(dbapi_connection, "driver_connection", None)
    if isinstance(driver, asyncpg.Connection) and driver.is_closed():
        raise sa.exc.DisconnectionError("the pooled connection was closed")


def _on_checkout(after: float, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    checked_in_at = record.info.get(_CHECKED_IN_AT)
    if checked_in_at is None or time.monotonic() - checked_in_at < after:
        return  # a new connection, or one in steady use
    try:
        dbapi_connection.ping()
    except Exception as exc:
        # The pool discards this connection and checks out (or opens) another one.
        raise sa.exc.DisconnectionError(f"stale pooled connection: {exc}") from exc


# -- attempts on the driver ---------------------------------------------------------------
# On asyncpg an attempt's own statements go straight to the driver, and the job's go through
# an AsyncSession on the same connection in SQLAlchemy's AUTOCOMMIT mode, so SQLAlchemy sends
# no BEGIN, COMMIT or ROLLBACK of its own: all of them run inside the one transaction that
# `begin_attempt` opens and `commit_attempt` / `rollback_attempt` end. Three round trips for
# an attempt (BEGIN; lock-and-claim; finish-and-COMMIT) and no SQLAlchemy statement machinery
# on oncely's side; the job's session is a plain AsyncSession.

# LOCK_AND_CLAIM, for the driver; it also names the claimed slot in two transaction-local
# settings, so the finish below is a constant string that can travel with the COMMIT, and
# (with $10) reads whether a pause of the job holds the slot's time (`sql.pause_covering`):
# `app.run` then sends no statement of its own for it. The same snapshot as a read after the
# lock would have, but for the transactions that commit in between: a pause has no lock to
# order it with an attempt (docs/design/fate.md: a pause whose commit lands late).
DRIVER_LOCK_AND_CLAIM = """
    WITH lock AS (
        SELECT pg_try_advisory_xact_lock($1, $2) AS got
    ), job_lock AS (
        SELECT CASE WHEN $3::boolean THEN pg_try_advisory_xact_lock($4, $5)
                    ELSE true END AS got
    ), ins AS (
        INSERT INTO oncely_runs (job, key, scheduled_for, claimed_at, claimed_by)
        SELECT $6::varchar, $7::varchar, $8::timestamptz, now(), $9::varchar
        FROM lock, job_lock WHERE lock.got AND job_lock.got
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT (SELECT got FROM lock) AS got, (SELECT got FROM job_lock) AS job_free,
           (SELECT count(*) FROM ins) AS claimed,
           CASE WHEN (SELECT count(*) FROM ins) > 0 THEN txid_current() END AS xid,
           set_config('oncely.job', $6::varchar, true) AS claimed_job,
           set_config('oncely.key', $7::varchar, true) AS claimed_key,
           CASE WHEN $10::boolean THEN EXISTS (
               SELECT 1 FROM oncely_pauses WHERE job = $6::varchar
               AND paused_at <= $8::timestamptz
               AND (resumed_at IS NULL OR resumed_at > $8::timestamptz)
           ) END AS paused
"""

# Stamp the end of the slot claimed above and commit, in one message (one round trip). A
# failing UPDATE (an aborted transaction) stops the message before its COMMIT.
DRIVER_FINISH_AND_COMMIT = (
    "UPDATE oncely_runs SET finished_at = clock_timestamp() "
    "WHERE job = current_setting('oncely.job') AND key = current_setting('oncely.key'); "
    "COMMIT"
)
# Once the slot is locked and claimed (the statement above): refuse it if an attempt gave it
# up or its retry is not due (a division by zero stops the message before the SAVEPOINT), else
# take the savepoint a failed attempt rolls back to. A statement of its own, after the lock's:
# its snapshot sees the fate that the lock's previous holder committed as it let go.
DRIVER_CHECK_AND_SAVEPOINT = (
    "SELECT 1 / (1 - count(*)) FROM (SELECT 1 FROM oncely_attempts "
    "WHERE job = current_setting('oncely.job') AND key = current_setting('oncely.key') "
    "AND (final OR retry_at IS NOT NULL) AND (final OR retry_at > clock_timestamp()) "
    "LIMIT 1) AS refused; SAVEPOINT oncely_attempt"
)
# Why the check above refused a slot (read after the rollback, the rare path).
DRIVER_MARKS = (
    "SELECT bool_or(final) AS final, max(retry_at) AS retry_at, count(*) AS tries, "
    "clock_timestamp() AS now FROM oncely_attempts "
    "WHERE job = $1 AND key = $2 AND (final OR retry_at IS NOT NULL)"
)
DRIVER_FINISH = "UPDATE oncely_runs SET finished_at = clock_timestamp() WHERE job = $1 AND key = $2"
DRIVER_HAS_CLAIM = "SELECT 1 FROM oncely_runs WHERE job = $1 AND key = $2"


# The bare claim on a caller's asyncpg connection (see `claim_on_driver`).
DRIVER_CLAIM = (
    "INSERT INTO oncely_runs (job, key, claimed_at, claimed_by) "
    "VALUES ($1, $2, clock_timestamp(), $3) ON CONFLICT DO NOTHING RETURNING 1"
)


async def claim_on_driver(conn: Any, job: str, key: str, claimed_by: str) -> bool:
    """`claim_run` on an asyncpg connection: the same INSERT, with no SQLAlchemy in between.

    The connection must be inside the caller's transaction: outside one the claim would
    commit at once, apart from the work it guards, so that is refused and nothing is sent.
    """
    if not conn.is_in_transaction():
        raise BadInputError(
            f"claim_run({job!r}, {key!r}) needs the caller's open transaction: on an asyncpg "
            "connection, call it inside `async with conn.transaction():` so the claim "
            "commits with your work or not at all"
        )
    try:
        return await conn.fetchval(DRIVER_CLAIM, job, key, claimed_by) is not None
    except asyncpg.UndefinedTableError as exc:
        raise SchemaMissingError(MISSING_TABLES) from exc
    except asyncpg.PostgresError as exc:
        raise DatabaseError(f"claiming failed: {exc}") from exc


# -- a task's own transaction, on the driver ---------------------------------------------
# A task's session runs in SQLAlchemy's AUTOCOMMIT mode on the worker's pool, as an attempt's
# does: its first statement checks a connection out, and `begin_task` then opens the task's
# transaction on the driver, durable although the pool's connections are not (a lease or a
# heartbeat does not wait for the disk). The ack and the COMMIT travel in one message: a lost
# lease makes the ack's count zero, the division fails, and the message stops before COMMIT.

TASK_BEGIN = "BEGIN; SET LOCAL synchronous_commit TO on"
TASK_ACK_AND_COMMIT = (
    "WITH acked AS (UPDATE oncely_tasks SET state = 'succeeded', "
    "finished_at = clock_timestamp(), lease_expires_at = NULL "
    "WHERE id = {id:d} AND lease_token = '{token}' AND state = 'running' "
    "AND (concurrency IS NULL OR lease_expires_at > clock_timestamp()) RETURNING 1) "
    "SELECT 1 / count(*) FROM acked; COMMIT"
)
# Schema 13: the same ack as a function, so that the server plans its UPDATE once per
# connection (plpgsql keeps the plan) instead of at every task: the UPDATE's planning, with the
# table's ten partial indexes to weigh, cost more server CPU than its run (on one connection,
# 0.175-0.23 ms of the backend's CPU per ack transaction as text against 0.075-0.115 ms through
# the function; docs/scale.md). A lost lease raises no_data_found (P0002).
TASK_ACK_FUNCTION_DDL = (
    """
    CREATE OR REPLACE FUNCTION oncely_task_ack(p_id bigint, p_token varchar) RETURNS void AS $$
    BEGIN
        UPDATE oncely_tasks SET state = 'succeeded', finished_at = clock_timestamp(),
            lease_expires_at = NULL
        WHERE id = p_id AND lease_token = p_token AND state = 'running'
            AND (concurrency IS NULL OR lease_expires_at > clock_timestamp());
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the task''s lease was lost' USING ERRCODE = 'no_data_found';
        END IF;
    END;
    $$ LANGUAGE plpgsql
    """,
)
TASK_ACK_CALL_AND_COMMIT = "SELECT oncely_task_ack({id:d}, '{token}'); COMMIT"
# The two values above are written into the message, not bound: a simple query (the only kind
# that carries a COMMIT with it) takes no parameters. Both are oncely's own: the task's id (an
# int) and the worker's lease token, which must match this pattern (see TaskWorker.token).
_TOKEN = re.compile(r"[0-9a-f]{1,32}\.[0-9]{1,20}")


def _task_ack_sql(task_id: int, token: str, *, function: bool = False) -> str:
    if not isinstance(task_id, int) or not _TOKEN.fullmatch(token):
        raise BadInputError(f"not a task id and lease token: {task_id!r}, {token!r}")
    sql = TASK_ACK_CALL_AND_COMMIT if function else TASK_ACK_AND_COMMIT
    return sql.format(id=task_id, token=token)


# -- a caller's AsyncSession on asyncpg -------------------------------------------------------
# `claim_run` and `enqueue` on a user's AsyncSession send their statement on the session's own
# asyncpg connection, as on a bare one: the prepared statement, with no SQLAlchemy statement
# machinery (compilation, cursor, result) in between, which costs more CPU than the round trip.
# The statement must run inside the session's transaction. SQLAlchemy sends its BEGIN lazily,
# with the session's first statement; for a session that has not sent one yet, the BEGIN is
# sent here the way SQLAlchemy's adapter sends it (so that its COMMIT and ROLLBACK end this
# very transaction). The session's pending objects are flushed first if its autoflush is on,
# as `session.execute` of the same INSERT would: the order of the writes, and where a flush
# error is raised, do not depend on the driver.


async def session_driver(session: AsyncSession, conn: AsyncConnection | None = None) -> Any:
    """The asyncpg connection of the session's connection (`conn` if the caller has it), in
    the session's transaction (begun here if SQLAlchemy has not sent its BEGIN yet), or
    outside any if the session runs in autocommit mode; None if SQLAlchemy's adapter cannot
    be driven that way."""
    sync = session.sync_session
    if sync.autoflush and (sync.new or sync.deleted or sync.identity_map.check_modified()):
        await session.flush()
    if conn is None:
        conn = await session.connection()
    adapted = conn.sync_connection.connection.dbapi_connection  # type: ignore[union-attr]
    driver = getattr(adapted, "driver_connection", None)
    if not isinstance(driver, asyncpg.Connection):
        return None
    if driver.is_in_transaction() or getattr(adapted, "autocommit", False):
        return driver
    begin = getattr(adapted, "_start_transaction", None)  # what the adapter's cursor awaits
    if begin is None:
        return None
    try:
        await begin()
    except Exception as exc:  # the adapter's own error class, from the driver's
        raise DatabaseError(f"beginning the transaction failed: {exc.__cause__ or exc}") from exc
    return driver if driver.is_in_transaction() else None


_ON_DRIVER: weakref.WeakKeyDictionary[Any, tuple[str, list[str], dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)
"""Statements expanded for the driver, for as long as their statement lives."""


def _on_driver(
    stmt: Any, dialect: sa.Dialect, params: dict[str, Any]
) -> tuple[str, list[str], dict[str, Any]]:
    """`stmt` as asyncpg takes it: its text with positional parameters (each element of a
    list the statement holds, such as a worker's task names, one of them), their names in
    order, and the values the statement holds (the caller's `p_*` come with each call)."""
    found = _ON_DRIVER.get(stmt)
    if found is None:
        # The values the statement holds are plain (its task names and queues, a NULL): no
        # type of theirs processes a bound value on Postgres, nor do the rows need one
        # (timestamptz comes back as aware UTC datetimes, as UTCDateTime returns them).
        expanded = stmt.compile(dialect=dialect).construct_expanded_state(params)
        fixed = {k: v for k, v in expanded.parameters.items() if k not in params}
        found = _ON_DRIVER[stmt] = (expanded.statement, list(expanded.positiontup or ()), fixed)
    return found


def _driver(conn: AsyncConnection) -> Any:
    """The asyncpg connection under a checked-out connection, at hand without I/O
    (get_raw_connection() would take a greenlet round of its own to answer the same)."""
    return conn.sync_connection.connection.driver_connection  # type: ignore[union-attr]


async def _checked_on_driver(driver: Any, job: str, key: str) -> ClaimOutcome:
    """The claimed slot's check and savepoint (DRIVER_CHECK_AND_SAVEPOINT); refused, the
    transaction is rolled back and the slot's marks say why (BUSY if they no longer refuse:
    a retry came due meanwhile, the worker tries again soon)."""
    try:
        await driver.execute(DRIVER_CHECK_AND_SAVEPOINT)
    except asyncpg.DivisionByZeroError:
        await driver.execute("ROLLBACK")
        row = await driver.fetchrow(DRIVER_MARKS, job, key)
        return marks_verdict(SimpleNamespace(**dict(row))) or ClaimOutcome.BUSY
    return ClaimOutcome.CLAIMED


class PostgresDialect(Dialect):
    name = "postgresql"

    def engine_options(self) -> dict[str, Any]:
        return {"connect_args": {"timeout": 10}}

    def configure_engine(
        self, engine: AsyncEngine, *, ping_after_idle: float | None = None
    ) -> None:
        after = PING_AFTER_IDLE_S if ping_after_idle is None else ping_after_idle
        event.listen(engine.sync_engine.pool, "checkin", _on_checkin)
        event.listen(engine.sync_engine.pool, "checkout", functools.partial(_on_checkout, after))

    def sync_engine_options(self) -> dict[str, Any]:
        return {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}

    def lane_options(self) -> dict[str, Any]:
        # A lease, a heartbeat or a rescue needs no fsync of its own: if the server crashes
        # before it is flushed, the task is simply leased again. A task's own transaction asks
        # for a durable commit (TASK_BEGIN), which flushes the WAL up to the leases before it.
        return {"connect_args": {"timeout": 10, "server_settings": {"synchronous_commit": "off"}}}

    def sync_driver(self) -> str:
        for module, driver in (
            ("psycopg2", "postgresql+psycopg2"),
            ("psycopg", "postgresql+psycopg"),
        ):
            if importlib.util.find_spec(module) is not None:
                return driver
        raise ConfigError(
            "synchronous effects on Postgres need a sync driver: pip install 'psycopg[binary]' "
            "(psycopg 3, what oncely's `sync` extra installs), or psycopg2"
        )

    def insert(self) -> Any:
        return postgresql.insert

    def now(self) -> Any:
        return sa.func.clock_timestamp()

    def scan_now(self) -> Any:
        # clock_timestamp() changes within a statement, so no index scan starts from it;
        # now() is the transaction's start: in an autocommitted statement, the statement's.
        return sa.func.now()

    def lock_and_claim_plan(self, request: ClaimRequest) -> Plan[ClaimOutcome]:
        job, key = request.job, request.key
        slot_hi, slot_lo = slot_lock_key(job, key)
        job_hi, job_lo = job_lock_key(job)
        params = {
            "slot_hi": slot_hi,
            "slot_lo": slot_lo,
            "exclusive": request.exclusive,
            "job_hi": job_hi,
            "job_lo": job_lo,
            **request.claim_params(),
        }
        row: Any = (yield LOCK_AND_CLAIM, params).one()
        if not row.got:
            return ClaimOutcome.BUSY
        if not row.job_free:
            # Another slot of the job is running; unless this slot ran before, that overlaps.
            taken = (yield sql.get_claim(job, key), None).first() is not None
            return ClaimOutcome.TAKEN if taken else ClaimOutcome.OVERLAP
        if not row.claimed:
            return ClaimOutcome.TAKEN
        return (yield from checked_plan(job, key, self.now()))

    async def lock_and_claim(self, session: AsyncSession, request: ClaimRequest) -> ClaimOutcome:
        driver = attempt_driver(session)
        if driver is None:
            return await run_async(session, self.lock_and_claim_plan(request))
        job, key = request.job, request.key
        slot_hi, slot_lo = slot_lock_key(job, key)
        job_hi, job_lo = job_lock_key(job)
        row = await driver.fetchrow(
            DRIVER_LOCK_AND_CLAIM,
            slot_hi,
            slot_lo,
            request.exclusive,
            job_hi,
            job_lo,
            job,
            key,
            request.scheduled_for,
            request.claimed_by,
            request.check_pause,
        )
        if row["claimed"]:
            mark_claimed(session, job, key, row["xid"])
        if row["paused"] is not None:
            mark_pause_read(session, job, request.scheduled_for, row["paused"])
        if not row["got"]:
            return ClaimOutcome.BUSY
        if not row["job_free"]:
            # Another slot of the job is running; unless this slot ran before, that overlaps.
            taken = await driver.fetchval(DRIVER_HAS_CLAIM, job, key) is not None
            return ClaimOutcome.TAKEN if taken else ClaimOutcome.OVERLAP
        if not row["claimed"]:
            return ClaimOutcome.TAKEN
        return await _checked_on_driver(driver, job, key)

    def attempt_engine(self, engine: AsyncEngine) -> AsyncEngine | None:
        if engine.dialect.driver != "asyncpg":
            return None  # another driver: SQLAlchemy runs the attempt's transaction
        pool = engine.sync_engine.pool
        if not event.contains(pool, "checkin", _close_if_open):
            event.listen(pool, "checkin", _close_if_open)
            event.listen(pool, "checkout", _refuse_closed)
        return engine.execution_options(isolation_level="AUTOCOMMIT")

    async def begin_attempt(self, conn: AsyncConnection) -> Any:
        driver = _driver(conn)
        await driver.execute("BEGIN")
        return driver

    async def commit_attempt(self, driver: Any, job: str, key: str, claimed: bool) -> None:
        if claimed:
            await driver.execute(DRIVER_FINISH_AND_COMMIT)
        else:
            await driver.execute(DRIVER_FINISH, job, key)
            await driver.execute("COMMIT")

    async def rollback_attempt(self, driver: Any) -> None:
        if not driver.is_closed() and driver.is_in_transaction():
            await driver.execute("ROLLBACK")

    async def reusable(self, conn: AsyncConnection, idle_s: float) -> bool:
        driver = _driver(conn)
        if driver.is_closed() or driver.is_in_transaction():
            return False
        if idle_s < PING_AFTER_IDLE_S:
            return True  # in steady use, as for a pooled connection (see _on_checkout)
        try:
            await driver.execute(";", timeout=PING_TIMEOUT_S)
        except Exception:
            return False
        return True

    def task_engine(self, engine: AsyncEngine) -> AsyncEngine:
        return self.attempt_engine(engine) or engine

    async def task_connection_ok(self, conn: AsyncConnection, idle_s: float) -> bool:
        if conn.closed or conn.invalidated:
            return False
        if conn.engine.dialect.driver != "asyncpg":
            return not conn.in_transaction()
        return await self.reusable(conn, idle_s)

    def autocommit(self, engine: AsyncEngine) -> AsyncEngine:
        return engine.execution_options(isolation_level="AUTOCOMMIT")

    def begin_task(self, connection: Connection, *, begun: bool = False) -> Any:
        driver = getattr(connection.connection, "driver_connection", None)
        autocommit = connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
        if not autocommit or not isinstance(driver, asyncpg.Connection):
            return None  # SQLAlchemy's BEGIN (another driver, or the user's own engine)
        if not (begun and driver.is_in_transaction()):
            await_only(driver.execute(TASK_BEGIN))
        return driver

    async def ack_and_commit(
        self,
        driver: Any,
        task_id: int,
        token: str,
        *,
        begin_next: bool = False,
        function: bool = False,
    ) -> bool:
        sql = _task_ack_sql(task_id, token, function=function)
        try:
            await driver.execute(f"{sql}; {TASK_BEGIN}" if begin_next else sql)
        except (asyncpg.DivisionByZeroError, asyncpg.NoDataFoundError):
            await driver.execute("ROLLBACK")
            return False
        return True

    async def rollback_task(self, driver: Any) -> None:
        await self.rollback_attempt(driver)

    def migration_lock(self) -> Step | None:
        return (
            sa.text("SELECT pg_advisory_xact_lock(:ns, :id)"),
            {"ns": LOCK_NAMESPACE, "id": _MIGRATION_LOCK},
        )

    database_clock = True
    notifies = True

    concurrent_leases = True
    writes_in_with = True

    def among(self, column: Any, ids: sa.Select[Any]) -> Any:
        # `= ANY(ARRAY(...))`: the ids are read once, first, and each row found by its
        # primary key. As `IN (subquery)` it is a join whose plan follows the statistics,
        # and on a table ANALYZEd before a burst of enqueues (autovacuum has not caught up)
        # the planner scanned every available task once per chosen one: 500 ms to lease 500
        # of 5,000 (tests/queue/test_lease_plan.py counts the rows a lease touches).
        return column == sa.any_(sa.func.array(ids.scalar_subquery()))

    def limit_lock(self, kind: str, task: Any, key: Any) -> Any:
        # 64 bits of the group's name (tagged by kind) as the two-int form, like the slot
        # locks: (hi, lo) never meet an application's one-key locks.
        name = sa.literal(f"oncely:{kind}:", sa.Text) + task + sa.literal("\x1f", sa.Text) + key
        h = sa.func.hashtextextended(name, 0)
        hi = sa.cast(h.op(">>")(32), sa.Integer)
        lo = sa.cast(h.op("&")(0xFFFFFFFF) - 0x80000000, sa.Integer)
        return sa.func.pg_try_advisory_xact_lock(hi, lo)

    def due_at(self, run_at: Any, delay: Any) -> Any:
        return sa.func.coalesce(
            run_at, sa.func.clock_timestamp() + sa.func.make_interval(0, 0, 0, 0, 0, 0, delay)
        )

    def bulk_enqueue(self, params: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]] | None:
        return ENQUEUE, enqueue_many_params(params)

    def epoch_minute(self, column: Any) -> Any:
        return sa.cast(sa.func.floor(sa.extract("epoch", column) / 60), sa.BigInteger)

    def after(self, seconds: float) -> Any:
        return sa.func.clock_timestamp() + sa.func.make_interval(
            0, 0, 0, 0, 0, 0, sa.literal(float(seconds), sa.Float)
        )

    def scan_ago(self, seconds: float) -> Any:
        return sa.func.now() - sa.func.make_interval(
            0, 0, 0, 0, 0, 0, sa.literal(float(seconds), sa.Float)
        )

    def listener(
        self,
        engine: AsyncEngine,
        on_notify: Callable[[str], None],
        on_lost: Callable[[], None] | None = None,
        prober: AsyncEngine | None = None,
    ) -> contextlib.AbstractAsyncContextManager[bool]:
        return _listen(engine, on_notify, on_lost, prober)

    def owns_connection(self, conn: object) -> bool:
        return isinstance(conn, asyncpg.Connection)

    async def claim_on_driver(self, conn: Any, job: str, key: str, claimed_by: str) -> bool:
        return await claim_on_driver(conn, job, key, claimed_by)

    async def enqueue_on_driver(self, conn: Any, params: list[dict[str, Any]]) -> list[Any]:
        return await enqueue_on_driver(conn, params)

    async def tasks_by_keys_on_driver(self, conn: Any, task: str, keys: list[str]) -> list[Any]:
        return await tasks_by_keys_on_driver(conn, task, keys)

    async def rows_on_driver(
        self, conn: AsyncConnection, stmt: Any, params: dict[str, Any]
    ) -> list[Any] | None:
        options = conn.sync_connection.get_execution_options()  # type: ignore[union-attr]
        if options.get("isolation_level") != "AUTOCOMMIT":
            return None  # a transaction SQLAlchemy holds: its BEGIN is not sent yet
        driver = _driver(conn)
        if not isinstance(driver, asyncpg.Connection):
            return None
        sql, names, fixed = _on_driver(stmt, conn.dialect, params)
        args = [params[name] if name in params else fixed[name] for name in names]
        return _driver_rows(await driver.fetch(sql, *args))

    async def session_driver(self, session: AsyncSession, bind: Any) -> Any:
        if bind.dialect.driver != "asyncpg":
            return None  # psycopg: the statement goes through the session
        return await session_driver(session, bind if isinstance(bind, AsyncConnection) else None)

    def tasks_ddl(self) -> Sequence[str]:
        return TASKS_NOTIFY_DDL

    def wake_ddl(self) -> Sequence[str]:
        return TASKS_NOTIFY_TXID_DDL

    def notify_setting_ddl(self) -> Sequence[str]:
        return TASKS_NOTIFY_SETTING_DDL

    def ack_ddl(self) -> Sequence[str]:
        return TASK_ACK_FUNCTION_DDL

    def foreign_driver(self, dbapi_connection: object) -> str:
        module = type(dbapi_connection).__module__
        return LENT_PSYCOPG2 if module.startswith("psycopg2") else LENT_PSYCOPG

    def foreign_cursor(self, cursor: Any) -> Any:
        # Django has its connection return json and jsonb as text (its JSONField decodes it);
        # this cursor decodes them as the driver does by default, which SQLAlchemy expects.
        if type(cursor).__module__.startswith("psycopg2"):
            import psycopg2.extras

            psycopg2.extras.register_default_json(cursor, loads=json.loads)
            psycopg2.extras.register_default_jsonb(cursor, loads=json.loads)
            return cursor
        from psycopg.types.json import JsonbLoader, JsonLoader

        cursor.adapters.register_loader("json", JsonLoader)
        cursor.adapters.register_loader("jsonb", JsonbLoader)
        return cursor

    def is_missing_table(self, exc: BaseException) -> bool:
        return _sqlstate(exc) == _MISSING_TABLE and "oncely_" in str(exc)

    slot_locks = True

    def record_options(self) -> dict[str, Any]:
        return {"isolation_level": "AUTOCOMMIT"}

    async def slot_held(self, conn: AsyncConnection, job: str, key: str) -> bool:
        hi, lo = slot_lock_key(job, key)
        # The two-int form's lock shows in pg_locks as classid, objid (unsigned) and objsubid 2.
        row = await conn.execute(SLOT_HELD, {"hi": hi & 0xFFFFFFFF, "lo": lo & 0xFFFFFFFF})
        return row.first() is not None

    async def xact_id(self, conn: Any) -> int | None:
        return int((await conn.execute(XACT_ID)).scalar_one())

    async def xact_status(self, conn: AsyncConnection, xid: int) -> str | None:
        status = (await conn.execute(XACT_STATUS, {"xid": xid})).scalar()
        return None if status is None else str(status)

    async def job_held(self, conn: AsyncConnection, job: str) -> bool:
        hi, lo = job_lock_key(job)
        row = await conn.execute(SLOT_HELD, {"hi": hi & 0xFFFFFFFF, "lo": lo & 0xFFFFFFFF})
        return row.first() is not None

    async def notify_cancel(self, conn: AsyncConnection, attempt_id: int) -> None:
        await conn.execute(
            sa.text("SELECT pg_notify(:channel, :payload)"),
            {"channel": CANCEL_CHANNEL, "payload": str(attempt_id)},
        )

    async def notify_workers(self, conn: AsyncConnection, payload: str) -> None:
        await conn.execute(
            sa.text("SELECT pg_notify(:channel, :payload)"),
            {"channel": TASKS_CHANNEL, "payload": payload},
        )

    async def notify_tasks(self, conn: AsyncConnection) -> None:
        await conn.execute(TASKS_NOTIFY)

    def cancel_listener(
        self, engine: AsyncEngine, on_notify: Callable[[int], None]
    ) -> contextlib.AbstractAsyncContextManager[bool]:
        return _listen_cancels(engine, on_notify)

    async def try_lock_slot(self, conn: AsyncConnection, job: str, key: str) -> bool:
        hi, lo = slot_lock_key(job, key)
        got = await conn.execute(
            sa.text("SELECT pg_try_advisory_xact_lock(:hi, :lo)"), {"hi": hi, "lo": lo}
        )
        return bool(got.scalar())

    def is_read_only(self, exc: BaseException) -> bool:
        return _sqlstate(exc) == _READ_ONLY

    def is_schema_problem(self, exc: BaseException) -> bool:
        return _sqlstate(exc) == _MISSING_COLUMN and "oncely_" in str(exc)

    def is_unavailable(self, exc: BaseException) -> bool:
        if isinstance(exc, asyncpg.InterfaceError) and "closed" in str(exc):
            return True  # asyncpg's "connection is closed"
        code = _sqlstate(exc)
        return code is not None and code.startswith(_UNAVAILABLE_PREFIXES)

    def is_driver_error(self, exc: BaseException) -> bool:
        return isinstance(exc, (asyncpg.PostgresError, asyncpg.InterfaceError))


# SQLAlchemy's drivers for a connection oncely borrows (store/borrowed.py): the same, without
# their connect hooks, which would change the owner's connection for good (psycopg2's UUID
# typecaster, psycopg's notice handler).
LENT_PSYCOPG, LENT_PSYCOPG2 = "oncely_lent_psycopg", "oncely_lent_psycopg2"


class LentPsycopg(PGDialect_psycopg):
    supports_statement_cache = True

    def on_connect(self) -> None:
        return None


class LentPsycopg2(PGDialect_psycopg2):
    supports_statement_cache = True

    def on_connect(self) -> None:
        return None


registry.register(f"postgresql.{LENT_PSYCOPG}", __name__, "LentPsycopg")
registry.register(f"postgresql.{LENT_PSYCOPG2}", __name__, "LentPsycopg2")


TASKS_CHANNEL = "oncely_tasks"
"""The LISTEN/NOTIFY channel that wakes idle workers when tasks are enqueued."""

NOTIFY_SETTING = "oncely.notify"
"""The server setting that turns enqueue notifications off (`off`), for a database, a role
or a connection: an enqueueing commit then takes no notification lock, workers poll."""

TASKS_NOTIFY = sa.text(
    "SELECT pg_notify('oncely_tasks', '')"
    " WHERE current_setting('oncely.notify', true) IS DISTINCT FROM 'off'"
)
"""A notification of tasks available, sent by hand (tasks handed back, retried by an
operator): no payload, so the idle workers take turns by the sender's process id. Nothing
where `oncely.notify` is off."""

# One notification per INSERT statement, sent by the enqueueing transaction itself: it is
# delivered iff that transaction commits, whichever client enqueued (oncely, psql, a trigger).
TASKS_NOTIFY_DDL = (
    f"""
    CREATE OR REPLACE FUNCTION oncely_tasks_notify() RETURNS trigger AS $$
    BEGIN
        PERFORM pg_notify('{TASKS_CHANNEL}', '');
        RETURN NULL;
    END;
    $$ LANGUAGE plpgsql
    """,
    "DROP TRIGGER IF EXISTS oncely_tasks_notify ON oncely_tasks",
    """
    CREATE TRIGGER oncely_tasks_notify AFTER INSERT ON oncely_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION oncely_tasks_notify()
    """,
)


# Schema 12: the trigger's notification names the enqueueing transaction (its id, the same
# for every INSERT of it, so one transaction still sends one notification): what the idle
# workers take turns by (see TaskWorker.notify).
TASKS_NOTIFY_TXID_DDL = (
    f"""
    CREATE OR REPLACE FUNCTION oncely_tasks_notify() RETURNS trigger AS $$
    BEGIN
        PERFORM pg_notify('{TASKS_CHANNEL}', txid_current()::text);
        RETURN NULL;
    END;
    $$ LANGUAGE plpgsql
    """,
)


# Schema 17: the trigger sends nothing where `oncely.notify` is `off` (unset: it sends, one
# notification per transaction, as before). A commit that notified nothing skips Postgres's
# instance-wide notification lock; the workers, reading the same setting, poll.
TASKS_NOTIFY_SETTING_DDL = (
    f"""
    CREATE OR REPLACE FUNCTION oncely_tasks_notify() RETURNS trigger AS $$
    BEGIN
        IF current_setting('{NOTIFY_SETTING}', true) IS DISTINCT FROM 'off' THEN
            PERFORM pg_notify('{TASKS_CHANNEL}', txid_current()::text);
        END IF;
        RETURN NULL;
    END;
    $$ LANGUAGE plpgsql
    """,
)

NOTIFY_OFF = sa.text(f"SELECT current_setting('{NOTIFY_SETTING}', true) = 'off'")
"""Whether enqueue notifications are off for this connection (the setting, if any, of its
database, role or own)."""


PROBE_TIMEOUT_S = 2.0
"""How long a new listener waits for its own probe notification before it concludes that
notifications do not reach it (e.g. behind PgBouncer in transaction pooling)."""
_PROBE = "probe:"
"""The start of a probe notification's payload (a task's notification carries the id of the
transaction that enqueued it, or nothing when sent by hand)."""


@contextlib.asynccontextmanager
async def _listen_on(
    engine: AsyncEngine,
    channel: str,
    callback: Callable[..., None],
    what: str | None,
    *,
    probe: bool = False,
    on_lost: Callable[[], None] | None = None,
    prober: AsyncEngine | None = None,
) -> AsyncIterator[bool]:
    """LISTEN on `channel` on a connection of its own; yield False if that is not possible
    (logged as a warning naming `what` listens, if given: the caller polls instead). With
    `probe`, True only once a notification sent from another connection (of `prober`, default
    `engine`: a worker sends it on its control connection, opening no third one) came
    back (`callback` must hand a probe's payload to `_Probe.seen`). `on_lost()` is called
    if the connection ends while the context is open."""
    log = logging.getLogger("oncely")
    try:
        conn = await engine.connect()
    except Exception as exc:  # the caller still polls; its own connections report errors
        if what:
            log.warning("cannot LISTEN for %s (%s); polling", what, exc)
        yield False
        return
    driver: Any = None
    lost = _Lost(on_lost)
    try:
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        await driver.add_listener(channel, callback)
        driver.add_termination_listener(lost)
    except Exception as exc:
        if what:
            log.warning("cannot LISTEN for %s (%s); polling", what, exc)
        driver = None
    works = driver is not None
    if works and probe:
        works = await _probed(prober or engine, channel, callback)
        if not works and what:
            log.warning(
                "LISTEN for %s works, but no notification arrives (a pooler in transaction"
                " mode?); polling",
                what,
            )
    try:
        yield works
    finally:
        lost.callback = None  # our own close is no loss
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.remove_termination_listener(lost)
                await driver.remove_listener(channel, callback)
        with contextlib.suppress(Exception):
            await conn.close()


class _Lost:
    """A listening connection's termination listener: calls back once, unless disarmed."""

    def __init__(self, callback: Callable[[], None] | None) -> None:
        self.callback = callback

    def __call__(self, _conn: Any) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


class _Probe:
    """The probes in flight in this process, by payload."""

    waiting: ClassVar[dict[str, asyncio.Event]] = {}

    @classmethod
    def seen(cls, payload: str) -> None:
        event = cls.waiting.get(payload)
        if event is not None:
            event.set()


async def _probed(engine: AsyncEngine, channel: str, callback: Callable[..., None]) -> bool:
    """Whether a notification sent on `channel` from another connection reaches the
    listener within PROBE_TIMEOUT_S."""
    payload = f"{_PROBE}{uuid.uuid4().hex}"
    arrived = _Probe.waiting[payload] = asyncio.Event()
    try:
        async with engine.connect() as other:
            await other.execute(
                sa.text("SELECT pg_notify(:channel, :payload)"),
                {"channel": channel, "payload": payload},
            )
            await other.commit()
        await asyncio.wait_for(arrived.wait(), PROBE_TIMEOUT_S)
    except Exception:  # no answer in time, or the probe could not be sent
        return False
    finally:
        del _Probe.waiting[payload]
    return True


@contextlib.asynccontextmanager
async def _listen(
    engine: AsyncEngine,
    on_notify: Callable[[str], None],
    on_lost: Callable[[], None] | None,
    prober: AsyncEngine | None = None,
) -> AsyncIterator[bool]:
    """LISTEN for new tasks, checked with a probe (sent from a connection of `prober`);
    yield False (poll only) if that is not possible, or if enqueue notifications are off
    (`oncely.notify`, read again at each try)."""

    def callback(_conn: Any, pid: Any, _channel: Any, payload: Any) -> None:
        if isinstance(payload, str) and payload.startswith(_PROBE):
            _Probe.seen(payload)  # a listener's check, ours or another worker's
        else:  # the enqueueing transaction's id (schema 12), else the sender's process
            on_notify(payload if isinstance(payload, str) and payload else f"pid {pid}")

    if await _notify_off(prober or engine):
        logging.getLogger("oncely").info(
            "enqueue notifications are off (%s = off); polling", NOTIFY_SETTING
        )
        yield False
        return
    listen = _listen_on(
        engine, TASKS_CHANNEL, callback, "new tasks", probe=True, on_lost=on_lost, prober=prober
    )
    async with listen as works:
        yield works


async def _notify_off(engine: AsyncEngine) -> bool:
    """Whether `oncely.notify` is `off` on a connection of `engine` (False if it cannot be
    read: the listener's own try reports that)."""
    try:
        async with engine.connect() as conn:
            return bool((await conn.execute(NOTIFY_OFF)).scalar())
    except Exception:
        return False


SLOT_HELD = sa.text(
    "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2"
    " AND classid::bigint = :hi AND objid::bigint = :lo AND database = ("
    "SELECT oid FROM pg_database WHERE datname = current_database())"
)
"""Whether some session holds a slot's (or a job's) advisory lock (read from pg_locks, not
taken)."""

XACT_ID = sa.text("SELECT txid_current()")
"""The open transaction's id: what a lost COMMIT's fate is asked by (see XACT_STATUS)."""
XACT_STATUS = sa.text("SELECT txid_status(:xid)")
"""What became of a transaction by its id: committed, aborted, in progress (NULL: too old
to tell)."""

CANCEL_CHANNEL = "oncely_cancel"
"""The channel a cancel request wakes the process running the attempt on (payload: its id)."""


def _listen_cancels(
    engine: AsyncEngine, on_notify: Callable[[int], None]
) -> contextlib.AbstractAsyncContextManager[bool]:
    """LISTEN for cancel requests on a connection of its own; yield False if not possible."""

    def callback(_conn: Any, _pid: Any, _channel: Any, payload: Any) -> None:
        with contextlib.suppress(ValueError):
            on_notify(int(payload))

    return _listen_on(engine, CANCEL_CHANNEL, callback, None)  # the runner still polls


# Enqueue any number of tasks in one round trip: the arguments as one JSON array, the other
# columns as arrays beside it (NULL when the same for all: the task, queue and trace context
# then come as one value; keys, times and delays as none), in input order (ids follow it); existing
# (task, idempotency_key) pairs skipped. One JSON document and few arrays keep the encoding
# of a thousand tasks to a few microseconds each on both sides.
_ENQUEUE_MANY = """
    INSERT INTO oncely_tasks
        (task, queue, args, state, attempt, run_at, created_at, idempotency_key,
         priority, concurrency_key, concurrency, rate_key, rate, rate_period, trace_context)
    SELECT coalesce(u.task, {task}), coalesce(u.queue, {queue}), u.args, 'available', 0,
           coalesce(u.run_at, clock_timestamp() + make_interval(secs => coalesce(u.delay, 0))),
           clock_timestamp(), u.key, coalesce(u.priority, 0), u.ckey, u.conc, u.rkey, u.rate,
           u.period, coalesce(u.trace, {trace})
    FROM ROWS FROM (jsonb_array_elements({args}), unnest({tasks}), unnest({queues}),
                    unnest({keys}), unnest({run_ats}), unnest({delays}), unnest({priorities}),
                    unnest({ckeys}), unnest({concs}), unnest({rkeys}), unnest({rates}),
                    unnest({periods}), unnest({traces}))
         WITH ORDINALITY AS u(args, task, queue, key, run_at, delay, priority, ckey, conc, rkey,
                              rate, period, trace, ord)
    ORDER BY u.ord
    ON CONFLICT (task, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, task, idempotency_key, run_at, created_at
"""
_ENQUEUE_TYPES = {
    "args": "jsonb",
    "task": "varchar",
    "queue": "varchar",
    "tasks": "varchar[]",
    "queues": "varchar[]",
    "keys": "varchar[]",
    "run_ats": "timestamptz[]",
    "delays": "float8[]",
    "priorities": "int4[]",
    "ckeys": "varchar[]",
    "concs": "int4[]",
    "rkeys": "varchar[]",
    "rates": "int4[]",
    "periods": "float8[]",
    "trace": "text",
    "traces": "text[]",
}
_ENQUEUE_ORDER = tuple(_ENQUEUE_TYPES)
_ENQUEUE_LIMITS = {
    "priorities": "p_priority",
    "ckeys": "p_ckey",
    "concs": "p_conc",
    "rkeys": "p_rkey",
    "rates": "p_rate",
    "periods": "p_period",
}
"""The limit columns' arrays and their parameter in an enqueue's parameter set."""

ENQUEUE = sa.text(
    _ENQUEUE_MANY.format(**{k: f"CAST(:{k} AS {t})" for k, t in _ENQUEUE_TYPES.items()})
).columns(
    id=sa.BigInteger(),
    task=sa.String(),
    idempotency_key=sa.String(),
    run_at=UTCDateTime(),
    created_at=UTCDateTime(),
)

# The same, for an asyncpg connection: positional parameters in _ENQUEUE_ORDER.
DRIVER_ENQUEUE_MANY = _ENQUEUE_MANY.format(
    **{k: f"${_ENQUEUE_ORDER.index(k) + 1}::{t}" for k, t in _ENQUEUE_TYPES.items()}
)


def _same(values: list[Any]) -> bool:
    first = values[0]
    return all(v == first for v in values)


def enqueue_many_params(params: list[dict[str, Any]]) -> dict[str, Any]:
    """ENQUEUE's parameters for these parameter sets (those of `tasks_sql.enqueue`)."""
    tasks = [p["p_task"] for p in params]
    queues = [p["p_queue"] for p in params]
    keys = [p["p_key"] for p in params]
    run_ats = [p["p_run_at"] for p in params]
    delays = [p["p_delay"] for p in params]
    traces = [p.get("p_trace") for p in params]
    one_task, one_queue, one_trace = _same(tasks), _same(queues), _same(traces)
    return {
        "args": json.dumps([p["p_args"] for p in params]),
        "task": tasks[0] if one_task else None,
        "queue": queues[0] if one_queue else None,
        "tasks": None if one_task else tasks,
        "queues": None if one_queue else queues,
        "keys": keys if any(k is not None for k in keys) else None,
        "run_ats": run_ats if any(r is not None for r in run_ats) else None,
        "delays": delays if any(delays) else None,
        **{name: _array(params, p) for name, p in _ENQUEUE_LIMITS.items()},
        "trace": traces[0] if one_trace else None,
        "traces": None if one_trace else traces,
    }


def _array(params: list[dict[str, Any]], name: str) -> list[Any] | None:
    """One parameter of every set, or None if it is None in all of them (a priority: 0, its
    default). A limit group's key may be "" (the task's own group): kept."""
    values = [p.get(name) for p in params]
    empty = (None, 0) if name == "p_priority" else (None,)
    return values if any(v not in empty for v in values) else None


# -- enqueue on a caller's asyncpg connection -----------------------------------------------
# The rows ENQUEUE inserts, from one prepared statement on the driver: no SQLAlchemy between an
# application that speaks asyncpg and its INSERT. One task: VALUES; many: DRIVER_ENQUEUE_MANY.

DRIVER_ENQUEUE_ONE = """
    INSERT INTO oncely_tasks
        (task, queue, args, state, attempt, run_at, created_at, idempotency_key,
         priority, concurrency_key, concurrency, rate_key, rate, rate_period, trace_context)
    VALUES ($1::varchar, $2::varchar, $3::jsonb, 'available', 0,
            coalesce($5::timestamptz, clock_timestamp() + make_interval(secs => $6::float8)),
            clock_timestamp(), $4::varchar, coalesce($7::int4, 0), $8::varchar, $9::int4,
            $10::varchar, $11::int4, $12::float8, $13::text)
    ON CONFLICT (task, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, task, idempotency_key, run_at, created_at
"""

# The retained tasks of one task name with these idempotency keys (the duplicates' records).
DRIVER_TASKS_BY_KEYS = """
    SELECT id, task, queue, args::text AS args, state, attempt, run_at, created_at,
           idempotency_key, started_at, finished_at, locked_by, lease_expires_at, error,
           priority, result
    FROM oncely_tasks WHERE task = $1::varchar AND idempotency_key = any($2::varchar[])
"""


class Enqueued(NamedTuple):
    """What an enqueue on the driver reads back of a new row (RETURNING's columns, in order)."""

    id: int
    task: str
    idempotency_key: str | None
    run_at: datetime
    created_at: datetime


def _driver_rows(records: list[Any]) -> list[Any]:
    rows = [SimpleNamespace(**dict(r)) for r in records]
    for row in rows:
        if isinstance(getattr(row, "args", None), str):
            row.args = json.loads(row.args)
    return rows


async def enqueue_on_driver(conn: Any, params: list[dict[str, Any]]) -> list[Any]:
    """Insert tasks (the parameter sets of `tasks_sql.enqueue`) on an asyncpg connection, in
    its open transaction if it is in one (else the INSERT commits by itself); the new rows."""
    try:
        if len(params) == 1:
            p = params[0]
            record = await conn.fetchrow(
                DRIVER_ENQUEUE_ONE,
                p["p_task"],
                p["p_queue"],
                json.dumps(p["p_args"]),
                p["p_key"],
                p["p_run_at"],
                p["p_delay"],
                *(p.get(name) for name in _ENQUEUE_LIMITS.values()),
                p.get("p_trace"),
            )
            return [Enqueued._make(record)] if record is not None else []
        many = enqueue_many_params(params)
        records = await conn.fetch(DRIVER_ENQUEUE_MANY, *(many[k] for k in _ENQUEUE_ORDER))
        return [Enqueued._make(r) for r in records]
    except asyncpg.PostgresError as exc:
        _raise_enqueue_error(exc)


async def tasks_by_keys_on_driver(conn: Any, task: str, keys: list[str]) -> list[Any]:
    """The retained rows of `task` with these idempotency keys, on an asyncpg connection."""
    try:
        return _driver_rows(await conn.fetch(DRIVER_TASKS_BY_KEYS, task, keys))
    except asyncpg.PostgresError as exc:
        _raise_enqueue_error(exc)


def _raise_enqueue_error(exc: asyncpg.PostgresError) -> NoReturn:
    if isinstance(exc, asyncpg.UndefinedTableError):
        raise SchemaMissingError(MISSING_TABLES) from exc
    raise DatabaseError(f"enqueueing failed: {exc}") from exc
