"""What differs between Postgres and SQLite, as one interface with one file per database."""

from __future__ import annotations

import abc
import contextlib
import enum
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NoReturn

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.sql.dml import Insert

from .. import clock
from ..errors import DatabaseError, SchemaMissingError
from . import sql, task_queue_sql
from .plan import Plan, Step

MISSING_TABLES = (
    "oncely's tables are missing: run `oncely migrate` (or include "
    "oncely.schema.metadata in your migrations)"
)


def raise_translated(dialect: Dialect, exc: Exception) -> NoReturn:
    """A driver error of a statement oncely sent in the caller's transaction, as an
    OncelyError (SchemaMissingError for a missing table, else DatabaseError)."""
    if dialect.is_missing_table(exc):
        raise SchemaMissingError(MISSING_TABLES) from exc
    raise DatabaseError(f"claiming failed: {getattr(exc, 'orig', None) or exc}") from exc


class ClaimAnswer(enum.Enum):
    """What a claim statement answers (trying to lock and claim a slot): one input of the
    attempt's outcome, never the outcome itself."""

    CLAIMED = "claimed"
    """The claim row is ours, in the open transaction."""
    TAKEN = "taken"
    """A committed claim already exists: the slot ran before."""
    BUSY = "busy"
    """Another transaction holds the slot right now."""
    OVERLAP = "overlap"
    """Another slot of the same job is running right now (asked for with `exclusive`)."""
    GIVEN_UP = "given_up"
    """An earlier attempt at the slot failed, timed out or was cancelled and was not to be
    retried (its final record): no replica starts it again until an operator releases it."""
    RETRY_WAIT = "retry_wait"
    """An earlier attempt failed and the job's retry policy retries it later: not yet."""


def marks_verdict(row: Any, retry_now: bool = False) -> ClaimAnswer | None:
    """What a slot's marks (`sql.slot_marks`, read once its lock is held) say: GIVEN_UP,
    RETRY_WAIT (unless `retry_now`: the caller's retry runs it at once), or None (it may
    run)."""
    if row is None or not row.tries:
        return None
    if row.final:
        return ClaimAnswer.GIVEN_UP
    if not retry_now and row.retry_at is not None and row.retry_at > row.now:
        return ClaimAnswer.RETRY_WAIT
    return None


def checked_plan(job: str, key: str, now: Any, retry_now: bool = False) -> Plan[ClaimAnswer]:
    """Once the slot is locked and claimed: refuse it if its marks say so, else take the
    savepoint a failed attempt rolls back to (keeping the lock to record the slot's fate)."""
    row = (yield sql.slot_marks(job, key, now), None).first()
    verdict = marks_verdict(row, retry_now)
    if verdict is not None:
        return verdict
    yield sql.SAVEPOINT, None
    return ClaimAnswer.CLAIMED


@dataclass(frozen=True)
class ClaimRequest:
    """One attempt's ask of `lock_and_claim`: which slot, by whom, and how to try."""

    job: str
    key: str
    scheduled_for: datetime | None
    claimed_by: str
    busy_ms: int = 200
    """How long SQLite may wait for its write lock before answering BUSY (Postgres never
    waits: its lock is a try-lock)."""
    exclusive: bool = False
    """Also take the job's lock: OVERLAP while another slot of the job runs anywhere."""
    check_pause: bool = False
    """Also read whether a pause of the job holds `scheduled_for`, where the claim's statement
    can (Postgres on the driver: no statement of its own; see `session.pause_read`)."""
    retry_now: bool = False
    """The caller's retry (`oncely run`, `app.run`): a slot waiting for its retry policy's
    `retry_at` runs at once (its budget still counts; a given-up slot is still refused)."""

    def claim_params(self) -> dict[str, Any]:
        """The parameters of `Dialect.claim_statement` for this slot (database time aside)."""
        return {
            "job": self.job,
            "key": self.key,
            "scheduled_for": self.scheduled_for,
            "claimed_by": self.claimed_by,
        }


class EngineSettings(abc.ABC):
    """How oncely's engines and connections are set up on this database."""

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments for `create_async_engine` when oncely builds the engine."""
        return {}

    def lane_options(self) -> dict[str, Any]:
        """`engine_options` for a worker's own connections (Postgres: commits that do not wait for
        the disk; a task's transaction asks for a durable commit itself, see `begin_task`)."""
        return {k: v for k, v in self.engine_options().items() if k != "pool_pre_ping"}

    def configure_engine(  # noqa: B027 - optional hook
        self, engine: AsyncEngine, *, ping_after_idle: float | None = None
    ) -> None:
        """Set up an engine that oncely built itself (not a user's engine); `ping_after_idle`:
        seconds a pooled connection may stay idle before it is checked at its next use
        (None: the dialect's default)."""

    def sync_engine_options(self) -> dict[str, Any]:
        """Keyword arguments for `create_engine` for oncely's synchronous engine."""
        return {}

    def configure_sync_engine(self, engine: Engine) -> None:  # noqa: B027 - optional hook
        """Set up the synchronous engine oncely builds for sync effects."""

    @abc.abstractmethod
    def sync_driver(self) -> str:
        """The SQLAlchemy driver name of oncely's synchronous engine for this database (a
        ConfigError if none is installed)."""

    def read_only_options(self) -> dict[str, Any]:
        """Execution options for a connection that only reads (and must not queue for the
        write lock)."""
        return {}

    def busy_options(self, busy_ms: int) -> dict[str, Any]:
        """Execution options for a connection that waits at most `busy_ms` for the write lock
        (Postgres has no database-wide write lock: none)."""
        return {}

    def owns_connection(self, conn: object) -> bool:
        """Whether `conn` is a bare connection of this database's own driver (asyncpg), which
        `claim_on_driver` and `enqueue_on_driver` take."""
        return False

    async def session_driver(self, session: AsyncSession, bind: Any) -> Any:
        """The driver connection under a caller's session (`bind`: what it runs on, an engine
        or the session's AsyncConnection), inside the session's own transaction, begun as
        SQLAlchemy begins it (or, for a session in autocommit mode, outside any); None: run
        oncely's statements through the session.
        Statements sent on it take the `*_on_driver` methods above."""
        return None

    def attempt_engine(self, engine: AsyncEngine) -> AsyncEngine | None:
        """An engine on which oncely runs an attempt's transaction on the driver itself, or
        None: SQLAlchemy's session runs it (`begin_attempt` and friends are then unused)."""
        return None

    def foreign_driver(self, dbapi_connection: object) -> str:
        """SQLAlchemy's name for the driver of a DB-API connection oncely does not own."""
        raise NotImplementedError

    def foreign_cursor(self, cursor: Any) -> Any:
        """A cursor of a borrowed connection, made to return values as SQLAlchemy expects
        them from this driver (its owner may have changed the connection's conversions)."""
        return cursor

    def record_options(self) -> dict[str, Any]:
        """Execution options for the short writes of attempt records (Postgres: autocommit,
        one round trip each, no transaction of their own)."""
        return {}

    def autocommit(self, engine: AsyncEngine) -> AsyncEngine:
        """`engine` for statements that are each a transaction of their own (a lease, a
        heartbeat): one round trip each where the driver allows, no BEGIN or COMMIT."""
        return engine

    def task_engine(self, engine: AsyncEngine) -> AsyncEngine:
        """The engine whose connections a worker lends to tasks' transactions (see
        `begin_task`), made once from an engine of the worker's own."""
        return engine

    def task_options(self, *, eager: bool) -> dict[str, Any]:
        """Execution options for a task's connection; `eager`: take the write lock at the
        transaction's first statement (SQLite, after a conflict), not at its first write."""
        return {}


class SqlFragments(abc.ABC):
    """The pieces of SQL that differ between databases: database time, the claim's and the
    enqueue's statements, limits' locks, the DDL of the later migrations."""

    @abc.abstractmethod
    def insert(self) -> Any:
        """The dialect's `insert` construct, which knows ON CONFLICT DO NOTHING."""

    @abc.abstractmethod
    def now(self) -> Any:
        """A SQL expression (or value) for the current instant in database time."""

    def now_sql(self) -> Any:
        """Database time inside a prebuilt statement: an SQL expression, or sql.NOW."""
        return self.now()

    def scan_now(self) -> Any:
        """Database time as an expression an index scan can start from (one value for the
        whole statement); `now_sql()` where that is one already."""
        return self.now_sql()

    def now_params(self) -> dict[str, Any]:
        """The parameters that `now_sql()` needs at execution time (a value for sql.NOW)."""
        return {}

    @functools.cached_property
    def claim_statement(self) -> Insert:
        """sql.claim_bound for this database, built once."""
        return sql.claim_bound(self.insert(), self.now_sql())

    @functools.cached_property
    def finish_statement(self) -> sa.Update:
        """sql.finish_bound for this database, built once."""
        return sql.finish_bound(self.now_sql())

    @functools.cached_property
    def enqueue_statement(self) -> Any:
        """task_queue_sql.enqueue for this database, built once (database time bound if need be)."""
        run_at, delay = task_queue_sql.enqueue_times()
        return task_queue_sql.enqueue(self.insert(), self.now_sql(), self.due_at(run_at, delay))

    def tasks_ddl(self) -> Sequence[str]:
        """Statements that follow the creation of oncely_tasks (Postgres: its NOTIFY trigger)."""
        return ()

    def wake_ddl(self) -> Sequence[str]:
        """Schema 12's statements: the NOTIFY trigger names the enqueueing transaction."""
        return ()

    def notify_setting_ddl(self) -> Sequence[str]:
        """Schema 18's statements: the NOTIFY trigger honours the `oncely.notify` setting."""
        return ()

    def ack_ddl(self) -> Sequence[str]:
        """Schema 13's statements: a task's ack as a function the server plans once per
        connection (see `ack_and_commit`)."""
        return ()

    def migration_lock(self) -> Step | None:
        """The statement that serializes concurrent `migrate` calls (several replicas
        starting at once), in the migration's transaction; None: its BEGIN already does."""
        return None

    database_clock = False
    """Whether `now()` is the database server's clock (else this machine's, bound as a value)."""

    def due_at(self, run_at: Any, delay: Any) -> Any:
        """A task's run_at from the bound `run_at` (a time or NULL) and `delay` (seconds).

        Without a database clock the caller binds the time itself and `delay` is unused.
        """
        return run_at

    def bulk_enqueue(self, params: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]] | None:
        """One statement and its parameters inserting all these tasks, if the database has a
        faster way than an executemany of `task_queue_sql.enqueue` (None: it has not)."""
        return None

    def after(self, seconds: float) -> Any:
        """A database-time expression for `seconds` from now (a lease's end)."""
        return clock.utcnow() + timedelta(seconds=seconds)

    def scan_ago(self, seconds: float) -> Any:
        """Database time `seconds` before `scan_now()`, as a value an index scan can start
        from (since when an idle worker's last lease looked)."""
        return clock.utcnow() - timedelta(seconds=seconds)

    @abc.abstractmethod
    def epoch_minute(self, column: Any) -> Any:
        """An SQL expression: the whole minutes since the Unix epoch of a stored instant (what
        the dashboard's per-minute counts group by)."""

    def among(self, column: Any, ids: sa.Select[Any]) -> Any:
        """`column IN (ids)` for a lease's last step: the rows of the ids a lease chose,
        each found by its key."""
        return column.in_(ids)

    def limit_lock(self, kind: str, task: Any, key: Any) -> Any:
        """Inside a lease: true if this transaction holds (or now took, without waiting) the
        lock of one limit group (`kind` "c" or "r", the task, the group's key). Without
        concurrent leases (SQLite's single writer) there is nothing to take."""
        return sa.true()


class ErrorChecks(abc.ABC):
    """What a driver error means on this database (a busy lock, a missing table, an outage …)."""

    def is_driver_error(self, exc: BaseException) -> bool:
        """Whether an exception is the driver's own (raised by statements sent on it)."""
        return False

    @abc.abstractmethod
    def is_missing_table(self, exc: BaseException) -> bool:
        """Whether a driver error means one of oncely's tables does not exist."""

    def is_unavailable(self, exc: BaseException) -> bool:
        """Whether a driver error means the database cannot be used at all (beyond I/O errors)."""
        return False

    def is_read_only(self, exc: BaseException) -> bool:
        """Whether a driver error means the database refuses every write (not an outage)."""
        return False

    def is_schema_problem(self, exc: BaseException) -> bool:
        """Whether a driver error means oncely's tables lack a column or table it uses."""
        return False

    def is_busy(self, exc: BaseException) -> bool:
        """Whether a driver error means another transaction holds the lock we asked for."""
        return False

    def is_conflict(self, exc: BaseException) -> bool:
        """Whether an error a task's transaction met is a conflict with another writer that
        running the attempt again resolves (SQLite's write lock), not the task's failing."""
        return False


class Notifications:
    """Wake-ups between processes (Postgres NOTIFY/LISTEN; SQLite has none)."""

    async def notify_cancel(self, conn: AsyncConnection, attempt_id: int) -> None:
        """In the open transaction: wake the process running this attempt once it commits
        (a cancel request); without notifications it finds the request by polling."""
        return None

    async def notify_workers(self, conn: AsyncConnection, payload: str) -> None:
        """Send `payload` to every listening worker, as a notification's key (a worker's
        word that notifications are answered: see TaskWorker.notify)."""
        return None

    async def notify_tasks(self, conn: AsyncConnection) -> None:
        """Wake the idle workers (once `conn`'s transaction commits): tasks became available
        otherwise than by an INSERT (whose trigger wakes them), e.g. handed back or retried."""
        return None

    def cancel_listener(
        self, engine: AsyncEngine, on_notify: Callable[[int], None]
    ) -> contextlib.AbstractAsyncContextManager[bool]:
        """Call `on_notify(attempt_id)` for each cancel request, while the context is open;
        yields whether notifications work (else the runner polls alone)."""
        return contextlib.nullcontext(False)

    notifies = False
    """Whether the database can wake a listener when tasks are enqueued (`listener`)."""

    def listener(
        self,
        engine: AsyncEngine,
        on_notify: Callable[[str], None],
        on_lost: Callable[[], None] | None = None,
        prober: AsyncEngine | None = None,
        on_refused: Callable[[BaseException], None] | None = None,
    ) -> contextlib.AbstractAsyncContextManager[bool]:
        """Call `on_notify(key)` whenever tasks are enqueued, while the context is open, and
        `on_lost()` if the listening connection goes away meanwhile (`on_refused(error)` if
        it could not be opened). `key` is the same for
        every listener of one notification, and varies from one to the next: what idle
        workers take turns by.

        Yields whether notifications work (one sent from another connection, of `prober`,
        default `engine`, arrived); without them workers rely on polling alone.
        """
        return contextlib.nullcontext(False)


class ConnectionStatements(SqlFragments):
    """Statements run on a connection (or on the driver itself, the fast paths), built from
    the fragments: the slot's lock and claim, an attempt's and a task's transaction, locks
    held, transaction ids."""

    def lock_and_claim_plan(self, request: ClaimRequest) -> Plan[ClaimAnswer]:
        """The statements of `lock_and_claim` once its transaction is open: on a database
        whose write lock is the slot's lock (SQLite) the claim alone."""
        params = {**request.claim_params(), **self.now_params()}
        row = (yield self.claim_statement, params).first()
        if row is None:
            return ClaimAnswer.TAKEN
        return (yield from checked_plan(request.job, request.key, self.now(), request.retry_now))

    @abc.abstractmethod
    async def lock_and_claim(self, session: AsyncSession, request: ClaimRequest) -> ClaimAnswer:
        """In the session's new transaction: take the slot's lock without waiting, then claim;
        once claimed, refuse a slot an earlier attempt gave up (or whose retry is not due),
        else take the savepoint that a failed attempt rolls back to (`sql.SAVEPOINT`).

        With `request.exclusive`, also take the job's lock without waiting: while one slot of
        the job runs anywhere, another slot's attempt answers OVERLAP (`overlap="skip"`).
        """

    async def claim_on_driver(self, conn: Any, job: str, key: str, claimed_by: str) -> bool:
        """`claims.claim_run` on a bare driver connection, in the caller's open transaction."""
        raise NotImplementedError

    async def enqueue_on_driver(self, conn: Any, params: list[dict[str, Any]]) -> list[Any]:
        """Insert tasks (the parameter sets of `task_queue_sql.enqueue`) on a bare driver
        connection; the new rows (id, task, idempotency_key, run_at, created_at)."""
        raise NotImplementedError

    async def rows_on_driver(
        self, conn: AsyncConnection, stmt: Any, params: dict[str, Any]
    ) -> list[Any] | None:
        """The rows of `stmt` (a statement a worker repeats, built once) sent with `params` on
        the driver of `conn`, an autocommit connection, without SQLAlchemy's statement
        machinery; None where it cannot go that way (SQLAlchemy sends it then)."""
        return None

    async def tasks_by_keys_on_driver(self, conn: Any, task: str, keys: list[str]) -> list[Any]:
        """The retained rows of `task` with these idempotency keys, on a bare driver
        connection."""
        raise NotImplementedError

    async def begin_attempt(self, conn: AsyncConnection) -> Any:
        """Begin an attempt's transaction on the connection's driver; the driver connection."""
        raise NotImplementedError

    async def commit_attempt(self, driver: Any, job: str, key: str, claimed: bool) -> None:
        """Stamp (job, key) finished and commit; `claimed`: this attempt's lock_and_claim
        claimed exactly that key (the statement may then ride with the COMMIT)."""
        raise NotImplementedError

    async def rollback_attempt(self, driver: Any) -> None:
        """Roll back the attempt's transaction if it is still open."""
        raise NotImplementedError

    async def reusable(self, conn: AsyncConnection, idle_s: float) -> bool:
        """Whether an attempt's connection, idle `idle_s` seconds since its transaction ended,
        can run the next attempt as it is (see `held`); False: return it to the pool."""
        return False

    async def try_lock_slot(self, conn: AsyncConnection, job: str, key: str) -> bool:
        """In the connection's open write transaction, take the slot's lock without waiting
        (as an attempt does); False if an attempt at it is running right now."""
        return True

    row_leases = False
    """Whether the schedules' due rows are read with FOR UPDATE SKIP LOCKED and leased to the
    reader (Postgres); else the single writer reads them as they are (SQLite)."""

    slot_locks = False
    """Whether `slot_held` sees a running attempt's lock (Postgres' advisory locks); else a
    running attempt is known by its record alone."""

    async def slot_held(self, conn: AsyncConnection, job: str, key: str) -> bool:
        """Whether an attempt holds the slot's lock right now, read without taking it (a
        probe that took it would make a concurrent attempt at the slot answer busy)."""
        return False

    async def xact_id(self, conn: Any) -> int | None:
        """The id of the transaction open on `conn` (an AsyncConnection or AsyncSession), by
        which a lost COMMIT's fate can be asked (`xact_status`); None where there is none."""
        return None

    async def xact_status(self, conn: AsyncConnection, xid: int) -> str | None:
        """What became of transaction `xid`: "committed", "aborted", "in progress", or None
        (unknown, or a database that cannot tell)."""
        return None

    async def job_held(self, conn: AsyncConnection, job: str) -> bool:
        """Whether an exclusive attempt (`overlap="skip"`) of the job holds the job's lock
        right now, read without taking it."""
        return False

    async def probe_writes(self, conn: AsyncConnection) -> None:
        """Raise the driver's error if the database refuses writes; change nothing."""
        return None

    async def task_connection_ok(self, conn: AsyncConnection, idle_s: float) -> bool:
        """Whether a task's connection, idle `idle_s` seconds, can serve the next task."""
        return not conn.closed and not conn.invalidated and not conn.in_transaction()

    def begin_task(self, connection: Connection, *, begun: bool = False) -> Any:
        """Called (inside the session's greenlet) when a task's session begins on
        `connection`: begin the task's durable transaction on the driver (unless `begun`: the
        previous task's COMMIT began it, see `ack_and_commit`) and return the driver
        connection, or return None when SQLAlchemy's own BEGIN is the task's transaction."""
        return None

    async def begin_task_lent(self, connection: Connection, *, begun: bool = False) -> Any:
        """`begin_task` for a task that asks for the driver's connection before its session
        made a statement (`asyncpg_connection`), outside the session's greenlet: the driver
        connection in the task's transaction, or None (the session begins as usual)."""
        return None

    async def ack_and_commit(
        self,
        driver: Any,
        task_id: int,
        token: str,
        *,
        begin_next: bool = False,
        function: bool = False,
    ) -> bool:
        """On a driver `begin_task` returned: mark the task succeeded iff its lease is still
        ours and commit the task's work with it; False (rolled back) if the lease was lost.
        With `begin_next`, the next task's transaction begins in the same round trip, after
        the COMMIT (for a task waiting for this connection). With `function` (schema 13),
        the ack calls the database's function, whose plan the server keeps."""
        raise NotImplementedError

    async def rollback_task(self, driver: Any) -> None:
        """Roll back a task's transaction begun on the driver, if it is still open."""
        raise NotImplementedError

    def can_group(self, engine: AsyncEngine) -> bool:
        """Whether tasks' transactions on `engine` (a worker's pool) can hold a group of tasks,
        a savepoint each, driven on the driver (`begin_group`): Postgres on asyncpg."""
        return False

    async def begin_group(self, conn: AsyncConnection, *, begun: bool = False) -> Any:
        """Begin a group's durable transaction on `conn` (unless `begun`: handed over in one)
        and take the first task's savepoint; the driver connection, for the calls below."""
        raise NotImplementedError

    async def ack_in_group(self, driver: Any, task_id: int, token: str, *, function: bool) -> bool:
        """Ack a task of a group iff its lease is still ours, then release its savepoint and
        take the next task's, in one round trip; False if the lease was lost (the task's work
        rolled back to its savepoint, which stays for the next task)."""
        raise NotImplementedError

    async def undo_in_group(self, driver: Any) -> None:
        """Roll a group's task back to its savepoint (which stays for the next task)."""
        raise NotImplementedError

    async def next_in_group(self, driver: Any) -> None:
        """Release the savepoint of a group's task and take the next task's."""
        raise NotImplementedError

    async def commit_group(self, driver: Any, *, begin_next: bool = False) -> None:
        """Commit a group's transaction (with `begin_next`, begin the next transaction in the
        same round trip, for a task waiting for the connection)."""
        raise NotImplementedError

    writes_in_with = False
    """Whether a statement can UPDATE in a WITH and INSERT from it (Postgres): a failed
    attempt's outcome and its history row in one statement, atomic on an autocommit
    connection (a worker's settles); else two statements in the settle's transaction."""

    concurrent_leases = False
    """Whether two transactions may lease at once (Postgres), so that one may miss the
    other's lease committed while it ran: a lease of limited tasks then counts again."""


class Dialect(EngineSettings, ErrorChecks, Notifications, ConnectionStatements):
    """The database-specific half of the store, by concern: its engines' settings, its SQL
    fragments, its errors, its notifications, and its statements on a connection."""

    name: str
