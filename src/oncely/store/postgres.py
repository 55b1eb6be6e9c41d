"""Postgres: advisory transaction locks for the slot, `now()` for database time."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.util import await_only

from ..errors import ConfigError
from ..locks import job_lock_key, slot_lock_key
from . import sql
from .dialect import (
    ClaimAnswer,
    ClaimRequest,
    Dialect,
    checked_plan,
)
from .plan import Plan, Step, run_async
from .postgres_notify import (
    CANCEL_CHANNEL,
    TASKS_CHANNEL,
    TASKS_NOTIFY,
    TASKS_NOTIFY_DDL,
    TASKS_NOTIFY_SETTING_DDL,
    TASKS_NOTIFY_TXID_DDL,
    listen_cancels,
    listen_tasks,
)
from .postgres_statements import (
    DRIVER_FINISH,
    DRIVER_FINISH_AND_COMMIT,
    DRIVER_FINISH_STATEMENT,
    DRIVER_HAS_CLAIM,
    DRIVER_HAS_CLAIM_STATEMENT,
    DRIVER_LOCK_AND_CLAIM,
    DRIVER_LOCK_AND_CLAIM_STATEMENT,
    ENQUEUE,
    GROUP_BEGIN,
    GROUP_NEXT,
    GROUP_SAVEPOINT,
    GROUP_UNDO,
    LOCK_AND_CLAIM,
    SLOT_HELD,
    TASK_ACK_FUNCTION_DDL,
    TASK_BEGIN,
    XACT_ID,
    XACT_STATUS,
    checked_on_driver,
    claim_on_driver,
    driver_of,
    driver_rows,
    due_at,
    enqueue_many_params,
    enqueue_on_driver,
    expanded_on_driver,
    session_driver,
    task_ack_sql,
    tasks_by_keys_on_driver,
)
from .session import attempt_driver, mark_claimed, mark_pause_read

# The migration lock's two keys ("once", 0). Slot and job locks use the two-key form too,
# with all 64 bits from a hash (see oncely.locks), so they never meet an application's
# one-key (bigint) locks.
LOCK_NAMESPACE = 0x6F6E6365
_MIGRATION_LOCK = 0

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


def _chain(exc: BaseException) -> list[BaseException]:
    """An error and those it wraps: SQLAlchemy's `orig` (the driver adapter's error, whose own
    `orig` is asyncpg's) and each one's `__cause__`, a few levels deep."""
    found: list[BaseException] = []
    todo: list[object] = [exc]
    while todo and len(found) < 8:
        candidate = todo.pop(0)
        if isinstance(candidate, BaseException) and candidate not in found:
            found.append(candidate)
            todo += [getattr(candidate, "orig", None), candidate.__cause__]
    return found


def _sqlstate(exc: BaseException) -> str | None:
    for candidate in _chain(exc):
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

    def lock_and_claim_plan(self, request: ClaimRequest) -> Plan[ClaimAnswer]:
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
            return ClaimAnswer.BUSY
        if not row.job_free:
            # Another slot of the job is running; unless this slot ran before, that overlaps.
            taken = (yield sql.has_claim(job, key), None).first() is not None
            return ClaimAnswer.TAKEN if taken else ClaimAnswer.OVERLAP
        if not row.claimed:
            return ClaimAnswer.TAKEN
        return (yield from checked_plan(job, key, self.now(), request.retry_now))

    async def lock_and_claim(self, session: AsyncSession, request: ClaimRequest) -> ClaimAnswer:
        driver = attempt_driver(session)
        if driver is None:
            return await run_async(session, self.lock_and_claim_plan(request))
        job, key = request.job, request.key
        slot_hi, slot_lo = slot_lock_key(job, key)
        job_hi, job_lo = job_lock_key(job)
        values = {
            "slot_hi": slot_hi,
            "slot_lo": slot_lo,
            "exclusive": request.exclusive,
            "job_hi": job_hi,
            "job_lo": job_lo,
            "check_pause": request.check_pause,
            **request.claim_params(),
        }
        row = await driver.fetchrow(
            DRIVER_LOCK_AND_CLAIM, *DRIVER_LOCK_AND_CLAIM_STATEMENT.args(values)
        )
        if row["claimed"]:
            mark_claimed(session, job, key, row["xid"])
        if row["paused"] is not None:
            mark_pause_read(session, job, request.scheduled_for, row["paused"])
        if not row["got"]:
            return ClaimAnswer.BUSY
        if not row["job_free"]:
            # Another slot of the job is running; unless this slot ran before, that overlaps.
            has = DRIVER_HAS_CLAIM_STATEMENT.args({"job": job, "key": key})
            taken = await driver.fetchval(DRIVER_HAS_CLAIM, *has) is not None
            return ClaimAnswer.TAKEN if taken else ClaimAnswer.OVERLAP
        if not row["claimed"]:
            return ClaimAnswer.TAKEN
        return await checked_on_driver(driver, job, key, request.retry_now)

    def attempt_engine(self, engine: AsyncEngine) -> AsyncEngine | None:
        if engine.dialect.driver != "asyncpg":
            return None  # another driver: SQLAlchemy runs the attempt's transaction
        pool = engine.sync_engine.pool
        if not event.contains(pool, "checkin", _close_if_open):
            event.listen(pool, "checkin", _close_if_open)
            event.listen(pool, "checkout", _refuse_closed)
        return engine.execution_options(isolation_level="AUTOCOMMIT")

    async def begin_attempt(self, conn: AsyncConnection) -> Any:
        driver = driver_of(conn)
        await driver.execute("BEGIN")
        return driver

    async def commit_attempt(self, driver: Any, job: str, key: str, claimed: bool) -> None:
        if claimed:
            await driver.execute(DRIVER_FINISH_AND_COMMIT)
        else:
            finish = DRIVER_FINISH_STATEMENT.args({"claim_job": job, "claim_key": key})
            await driver.execute(DRIVER_FINISH, *finish)
            await driver.execute("COMMIT")

    async def rollback_attempt(self, driver: Any) -> None:
        if not driver.is_closed() and driver.is_in_transaction():
            await driver.execute("ROLLBACK")

    async def reusable(self, conn: AsyncConnection, idle_s: float) -> bool:
        driver = driver_of(conn)
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
        driver = _task_driver(connection)
        if driver is not None and not (begun and driver.is_in_transaction()):
            await_only(driver.execute(TASK_BEGIN))
        return driver

    async def begin_task_lent(self, connection: Connection, *, begun: bool = False) -> Any:
        driver = _task_driver(connection)
        if driver is not None and not (begun and driver.is_in_transaction()):
            await driver.execute(TASK_BEGIN)
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
        sql = task_ack_sql(task_id, token, function=function)
        try:
            await driver.execute(f"{sql}; {TASK_BEGIN}" if begin_next else sql)
        except (asyncpg.DivisionByZeroError, asyncpg.NoDataFoundError):
            await driver.execute("ROLLBACK")
            return False
        return True

    async def rollback_task(self, driver: Any) -> None:
        await self.rollback_attempt(driver)

    def can_group(self, engine: AsyncEngine) -> bool:
        options = engine.get_execution_options()
        return engine.dialect.driver == "asyncpg" and options.get("isolation_level") == (
            "AUTOCOMMIT"
        )

    async def begin_group(self, conn: AsyncConnection, *, begun: bool = False) -> Any:
        driver = driver_of(conn)
        begin = not (begun and driver.is_in_transaction())
        await driver.execute(GROUP_BEGIN if begin else GROUP_SAVEPOINT)
        return driver

    async def ack_in_group(self, driver: Any, task_id: int, token: str, *, function: bool) -> bool:
        try:
            await driver.execute(task_ack_sql(task_id, token, function=function, then=GROUP_NEXT))
        except (asyncpg.DivisionByZeroError, asyncpg.NoDataFoundError):
            await driver.execute(GROUP_UNDO)
            return False
        return True

    async def undo_in_group(self, driver: Any) -> None:
        await driver.execute(GROUP_UNDO)

    async def next_in_group(self, driver: Any) -> None:
        await driver.execute(GROUP_NEXT)

    async def commit_group(self, driver: Any, *, begin_next: bool = False) -> None:
        await driver.execute(f"COMMIT; {TASK_BEGIN}" if begin_next else "COMMIT")

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
        return due_at(run_at, delay)

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
        on_refused: Callable[[BaseException], None] | None = None,
    ) -> contextlib.AbstractAsyncContextManager[bool]:
        return listen_tasks(engine, on_notify, on_lost, prober, on_refused)

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
        driver = driver_of(conn)
        if not isinstance(driver, asyncpg.Connection):
            return None
        sql, names, fixed = expanded_on_driver(stmt, conn.dialect, params)
        args = [params[name] if name in params else fixed[name] for name in names]
        return driver_rows(await driver.fetch(sql, *args))

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
    row_leases = True

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
        return listen_cancels(engine, on_notify)

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
        # The server down, restarting or starting up, bare or wrapped by SQLAlchemy: a
        # connection refused or reset (OSError, a connect timeout too), asyncpg's
        # "connection is closed", SQLSTATE 08xxx (connection exceptions), 57P01 admin /
        # 57P02 crash shutdown, 57P03 cannot connect now ("the database system is starting
        # up", "not yet accepting connections", "shutting down"), and a few more that no
        # retry of oncely's fixes sooner than the server (28, 3D, 53300).
        for candidate in _chain(exc):
            if isinstance(candidate, OSError):
                return True
            if isinstance(candidate, asyncpg.InterfaceError) and "closed" in str(candidate):
                return True
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


def _task_driver(connection: Connection) -> Any:
    """The asyncpg connection under a task's connection of the worker's pool, where oncely
    holds the task's transaction on the driver (the pool's connections are in autocommit for
    SQLAlchemy); None where SQLAlchemy's BEGIN is the task's (another driver, the user's own
    engine)."""
    driver = getattr(connection.connection, "driver_connection", None)
    autocommit = connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
    if not autocommit or not isinstance(driver, asyncpg.Connection):
        return None
    return driver
