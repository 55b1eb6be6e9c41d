"""`Store`: oncely's tables in one database, reached through one async engine.

Driver and SQLAlchemy errors do not leave it except as the cause of an OncelyError: an
unreachable database becomes DatabaseUnavailableError (URL shown with its credentials masked), a
missing table SchemaMissingError.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool, QueuePool

from .. import hooks
from ..errors import (
    BadInputError,
    DatabaseError,
    DatabaseReadOnlyError,
    DatabaseUnavailableError,
    OncelyError,
    SchemaMissingError,
    SchemaTooNewError,
)
from ..masking import mask_url
from ..model import Claim, TaskRecord
from . import control, schedules, sql, task_store, tasks_sql, views
from .claims import claim_from_row, claim_in_plan, claim_plan, fate_plan, finish_plan
from .dialect import ClaimOutcome, ClaimRequest
from .dialects import dialect_for
from .held import HeldConnections
from .migrations import (
    ACK_FUNCTION,
    COMPATIBLE_UP_TO,
    CONTROL,
    DUPLICATES,
    JOBS,
    LATEST,
    REQUIRED,
    SCHEDULES,
    SLOT_FATE,
    TASK_ERRORS,
    apply_migrations,
)
from .outcome import task_landed
from .plan import run, run_async
from .session import (
    AttemptSession,
    attempt_driver,
    attempt_xact,
    claimed_here,
    end,
    hand_back,
    set_attempt_driver,
)
from .task_pool import TaskPool
from .urls import normalize_url, sync_url

CONTROL_WAIT_S = 3600.0
"""How long a worker's statement may wait for its control connection (held by the others,
one statement at a time)."""
CONTROL_PING_AFTER_IDLE_S = 60.0
"""Seconds the control connection may stay idle before its next use pings it (a ping is
three round trips: on an idle worker's every look for tasks, more than the look)."""
RELEASE_BUSY_MS = 500
"""How long `release` waits on SQLite for the write lock before answering "running"."""


class Store:
    """oncely's tables in one database, reached through one async engine."""

    def __init__(self, engine: AsyncEngine, *, owns_engine: bool) -> None:
        self.engine = engine
        self.dialect = dialect_for(engine.dialect.name)
        self._owns_engine = owns_engine
        self._attempts = async_sessionmaker(
            engine, sync_session_class=AttemptSession, expire_on_commit=False
        )
        # Where oncely runs an attempt's transaction on the driver itself (asyncpg), else None.
        self._driver_attempts = self.dialect.attempt_engine(engine)
        # Clean attempt connections kept for the next attempt, on oncely's own engine only.
        self._held = (
            HeldConnections() if owns_engine and self._driver_attempts is not None else None
        )
        self._schema_checked = False
        self._version: int | None = None
        self._sync_engine: sa.Engine | None = None
        self._sync_sessions: sessionmaker[AttemptSession] | None = None

    @classmethod
    def from_url(cls, url: str) -> Store:
        """Build the engine for a URL (Postgres via asyncpg, SQLite via aiosqlite)."""
        full = normalize_url(url)
        dialect = dialect_for(make_url(full).get_backend_name())
        engine = create_async_engine(full, **dialect.engine_options())
        dialect.configure_engine(engine)
        return cls(engine, owns_engine=True)

    def dedicated_engine(self) -> AsyncEngine:
        """An engine whose connections are opened for one holder each (a worker's listener,
        which keeps its own for its lifetime; a lost COMMIT's read-back, which must not read
        on a pooled one); a user's own engine is shared as it is."""
        if not self._owns_engine:
            return self.engine
        engine = create_async_engine(
            self.engine.url, poolclass=NullPool, **self.dialect.lane_options()
        )
        self.dialect.configure_engine(engine)
        return engine

    def worker_engines(self, pool_size: int) -> tuple[TaskPool, AsyncEngine]:
        """A task worker's pool (at most `pool_size` connections: each running task's
        transaction holds one from its first statement to its end) and the engine of its
        control connection (one: leases, outcomes, heartbeats, rescues, one statement at a
        time, never waiting behind tasks). On a user's own engine, both take its connections."""
        check = self.dialect.task_connection_ok
        if not self._owns_engine or not isinstance(self.engine.sync_engine.pool, QueuePool):
            shared = TaskPool(self.dialect.task_engine(self.engine), pool_size, check, keep=False)
            return shared, self.engine
        lent = create_async_engine(
            self.engine.url, poolclass=NullPool, **self.dialect.lane_options()
        )
        self.dialect.configure_engine(lent)
        control = create_async_engine(
            self.engine.url,
            pool_size=1,
            max_overflow=0,
            pool_timeout=CONTROL_WAIT_S,
            **self.dialect.lane_options(),
        )
        # The worker's own statements come every few seconds; a dead connection makes one of
        # them fail and be tried again, so only a connection idle for long is pinged first.
        self.dialect.configure_engine(control, ping_after_idle=CONTROL_PING_AFTER_IDLE_S)
        return TaskPool(self.dialect.task_engine(lent), pool_size, check), control

    @functools.cached_property
    def tasks(self) -> task_store.TaskStore:
        """The task queue's statements on this store."""
        return task_store.TaskStore(self)

    @functools.cached_property
    def control(self) -> control.Control:
        """The control plane's statements on this store (pauses, attempts, audit, cancel)."""
        return control.Control(self)

    @functools.cached_property
    def views(self) -> views.Views:
        """The dashboard's reads on this store (bounded by indexes, never a whole table)."""
        return views.Views(self)

    @functools.cached_property
    def schedules(self) -> schedules.ScheduleStore:
        """The statements of schedules kept as data on this store (oncely_schedules)."""
        return schedules.ScheduleStore(self)

    @property
    def has_schedules(self) -> bool:
        """Whether the database has oncely_schedules (schema 17)."""
        return self._version is not None and self._version >= SCHEDULES

    @property
    def has_control(self) -> bool:
        """Whether the database has the control plane's tables (known once the schema was
        checked: `ensure_schema`, `migrate`)."""
        return self._version is not None and self._version >= CONTROL

    @property
    def has_jobs(self) -> bool:
        """Whether the database records each job's first appearance (oncely_jobs)."""
        return self._version is not None and self._version >= JOBS

    @property
    def has_duplicates(self) -> bool:
        """Whether the database records suppressed duplicates (schema 8)."""
        return self._version is not None and self._version >= DUPLICATES

    @property
    def has_task_errors(self) -> bool:
        """Whether the database keeps every failed task attempt's error (schema 11)."""
        return self._version is not None and self._version >= TASK_ERRORS

    @property
    def has_ack_function(self) -> bool:
        """Whether the database has the task ack's function (schema 13, Postgres)."""
        return self._version is not None and self._version >= ACK_FUNCTION

    @property
    def has_slot_fate(self) -> bool:
        """Whether a failed attempt's fate is recorded in its own transaction (schema 14)."""
        return self._version is not None and self._version >= SLOT_FATE

    def has_spare_connection(self) -> bool:
        """Whether the engine's pool can lend one more connection without waiting (a pool
        of a fixed size, e.g. a user's `pool_size=1, max_overflow=0`, may have none while an
        attempt holds its connection): what a best-effort write outside the attempt asks."""
        pool = self.engine.sync_engine.pool
        if not isinstance(pool, QueuePool):
            return True
        limit = pool.size() + max(pool._max_overflow, 0) if pool._max_overflow >= 0 else None
        return limit is None or pool.checkedout() < limit

    @property
    def display_url(self) -> str:
        """The database URL with its credentials masked (userinfo and query string)."""
        return mask_url(self.engine.url.render_as_string(hide_password=False))

    @property
    def url(self) -> str:
        """The database URL, password included: for a child process that connects to the
        same database (never for a message or a log: see `display_url`)."""
        return self.engine.url.render_as_string(hide_password=False)

    async def dispose(self) -> None:
        """Close the pool if oncely built the engine (a user's engine is theirs to close)."""
        if self._held is not None:
            await self._held.close()
        if self._owns_engine:
            await self.engine.dispose()
        if self._sync_engine is not None:
            self._sync_engine.dispose()
            self._sync_engine = self._sync_sessions = None

    # -- errors -------------------------------------------------------------------------

    @contextlib.contextmanager
    def translate(self) -> Iterator[None]:
        """Turn driver errors raised by oncely's own statements into OncelyErrors."""
        try:
            yield
        except OncelyError:
            raise
        except sa.exc.DBAPIError as exc:
            raise self._translated(exc) from exc
        except sa.exc.StatementError as exc:
            if isinstance(exc.orig, OncelyError):  # a bound value oncely refused (BadTimeError)
                raise exc.orig from exc
            raise
        except (OSError, asyncio.TimeoutError) as exc:
            raise self._unavailable(exc) from exc
        except TypeError as exc:
            if "connect()" not in str(exc):
                raise
            # A URL query parameter the driver does not take (asyncpg's connect(**query)).
            raise BadInputError(
                f"the database URL {self.display_url} has an option the driver does not take: {exc}"
            ) from exc
        except Exception as exc:
            if self.dialect.is_driver_error(exc):  # a statement oncely sent on the driver
                raise self._translated(exc) from exc
            raise

    def _translated(self, exc: BaseException) -> OncelyError:
        if self.dialect.is_missing_table(exc):
            return SchemaMissingError(
                f"oncely's tables are missing in {self.display_url}: run `oncely migrate`"
            )
        if self.dialect.is_read_only(exc):
            return DatabaseReadOnlyError(
                f"the database at {self.display_url} is read-only: oncely writes its claims "
                f"and tasks there ({_driver_message(exc)})"
            )
        if self.dialect.is_schema_problem(exc):
            return DatabaseError(
                f"oncely's tables in {self.display_url} do not have the columns this oncely "
                f"uses ({_driver_message(exc)}): were they changed by hand?"
            )
        if self.dialect.is_unavailable(exc):
            return self._unavailable(exc)
        if isinstance(exc, sa.exc.DBAPIError) and (
            exc.connection_invalidated
            or (
                isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError))
                and not self.dialect.is_busy(exc)
            )
        ):
            return self._unavailable(exc)
        return DatabaseError(f"database error: {_driver_message(exc)}")

    def _unavailable(self, exc: BaseException) -> DatabaseUnavailableError:
        reason = _driver_message(exc) or type(exc).__name__
        return DatabaseUnavailableError(
            f"cannot reach the database at {self.display_url}: {reason}"
        )

    # -- schema -------------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Apply the migrations this database lacks, in one transaction; the versions applied."""
        with self.translate():
            async with self.engine.begin() as conn:
                applied = await conn.run_sync(apply_migrations, self._too_new)
        self._schema_checked = True
        self._version = LATEST  # or newer and compatible: LATEST's features are all there
        return applied

    async def schema_version(self) -> int | None:
        """The newest applied migration, or None if oncely's tables were never created."""
        try:
            with self.translate():
                async with self._reader() as conn:
                    value = (await conn.execute(sql.schema_version())).scalar()
                    await conn.rollback()
        except SchemaMissingError:
            return None
        return int(value) if value is not None else None

    def _too_new(self, version: int) -> SchemaTooNewError:
        return SchemaTooNewError(
            f"oncely's tables in {self.display_url} are at schema version {version}, from a "
            f"breaking migration this oncely cannot run on (it knows {LATEST} and runs on up "
            f"to {COMPATIBLE_UP_TO}): upgrade oncely to the release that migrated them"
        )

    async def ensure_schema(self, *, writes: bool = False) -> None:
        """Raise SchemaMissingError unless the database is at a version this oncely runs on
        (`migrations.REQUIRED` up to `COMPATIBLE_UP_TO`: a later release's additive
        migrations; checked once); SchemaTooNewError if newer.

        With `writes` (a worker starting), also DatabaseReadOnlyError if the database cannot
        be written: waiting would not help, unlike an outage.
        """
        if writes:
            with self.translate():
                async with self.engine.connect() as conn:
                    await self.dialect.probe_writes(conn)
        if self._schema_checked:
            return
        version = await self.schema_version()
        if version is None:
            raise SchemaMissingError(
                f"oncely's tables are missing in {self.display_url}: run `oncely migrate`"
            )
        if version < REQUIRED:
            raise SchemaMissingError(
                f"oncely's tables in {self.display_url} are at version {version}, this oncely "
                f"needs {LATEST}: run `oncely migrate`"
            )
        if version > COMPATIBLE_UP_TO:
            raise self._too_new(version)
        self._schema_checked = True
        self._version = min(version, LATEST)

    # -- one attempt --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def attempt(self) -> AsyncIterator[AsyncSession]:
        """A fresh session for one attempt, closed (rolled back if still open) at the end.

        On asyncpg the attempt's transaction is begun here, on the driver, and the session
        runs inside it (see `Dialect.attempt_engine`); elsewhere the session begins it.
        """
        if self._driver_attempts is None:
            session = self._attempts()
            try:
                yield session
            finally:
                hand_back(session.sync_session)
                with contextlib.suppress(Exception):
                    await session.close()
                end(session.sync_session)
            return
        conn = await self._held.take(self.dialect.reusable) if self._held is not None else None
        if conn is None:
            with self.translate():
                conn = await self._driver_attempts.connect()
        reusable = False
        try:
            with self.translate():
                driver = await self.dialect.begin_attempt(conn)
            session = self._attempts(bind=conn)
            set_attempt_driver(session, driver)
            try:
                yield session
            finally:
                hand_back(session.sync_session)
                if session.in_transaction():
                    with contextlib.suppress(Exception):
                        await session.close()
                end(session.sync_session)
                with contextlib.suppress(Exception):
                    await self.dialect.rollback_attempt(driver)
                    reusable = (
                        self._held is not None
                        and not conn.in_transaction()
                        and await self.dialect.reusable(conn, 0.0)
                    )
        finally:
            # A transaction still open here (a failed rollback) is closed with the socket
            # when the connection is checked in (see postgres._close_if_open).
            if not (reusable and self._held is not None and self._held.keep(conn)):
                with contextlib.suppress(Exception):
                    await conn.close()

    async def lock_and_claim(self, session: AsyncSession, request: ClaimRequest) -> ClaimOutcome:
        """Open the attempt's transaction, take the slot's lock without queueing, and claim
        (see ClaimRequest for what `busy_ms` and `exclusive` ask)."""
        with self.translate():
            return await self.dialect.lock_and_claim(session, request)

    async def claim_in(self, session: AsyncSession, job: str, key: str) -> Claim | None:
        """The committed claim of a slot, read in the given session."""
        with self.translate():
            return await run_async(session, claim_in_plan(job, key))

    async def finish(self, session: AsyncSession, job: str, key: str) -> None:
        """Stamp the run's end on its claim and commit work and claim together."""
        driver = attempt_driver(session)
        with self.translate():
            if driver is None:
                await run_async(session, finish_plan(self.dialect, job, key))
                hooks.before_commit(job, key)
                hand_back(session.sync_session)
                await session.commit()
                return
            if session.in_transaction() or session.new or session.dirty or session.deleted:
                await session.flush()  # the job's pending ORM changes, into the transaction
            hooks.before_commit(job, key)
            hand_back(session.sync_session)
            await self.dialect.commit_attempt(driver, job, key, claimed_here(session, job, key))

    async def give_up(
        self,
        session: AsyncSession,
        job: str,
        key: str,
        record: Callable[[int, datetime], tuple[Any, Any]],
    ) -> None:
        """End a failed attempt in its own transaction while it still holds the slot: roll
        its work back to the savepoint taken after the claim, drop its claim, write its end
        row (`record(tries, now)`: the statement, given how many marked attempts the slot had
        and database now) and commit, so no replica slips in between."""
        driver = attempt_driver(session)
        hand_back(session.sync_session)
        session.sync_session.expunge_all()  # the job's pending objects are not to be flushed
        with self.translate():
            await run_async(session, fate_plan(self.dialect, job, key, record))
            if driver is None:
                await session.commit()
            else:
                await driver.execute("COMMIT")

    def attempt_xact(self, session: AsyncSession) -> int | None:
        """The id of an attempt's transaction, read with its claim (Postgres, on the driver):
        what a lost COMMIT's fate is asked by; None where it was not read."""
        return attempt_xact(session)

    async def abandon(self, session: AsyncSession) -> None:
        """Roll the attempt back (claim included); a dead connection is already rolled back."""
        hand_back(session.sync_session)
        driver = attempt_driver(session)
        with contextlib.suppress(Exception):
            if driver is None:
                await session.rollback()
            else:
                await self.dialect.rollback_attempt(driver)

    # -- effects: a key claimed by any caller (a queue's task body, a script) -----------

    async def claim_effect(
        self, session: AsyncSession, job: str, key: str, claimed_by: str
    ) -> bool:
        """Open the session's transaction and claim (job, key); True if the claim is ours.

        Unlike `lock_and_claim` this waits for a concurrent holder of the same key to finish
        (Postgres: the row lock; SQLite: the write lock, up to its busy timeout), so a
        concurrent duplicate ends as a skip once the first commits, or runs if it rolled back.
        """
        with self.translate():
            return await run_async(session, claim_plan(self.dialect, job, key, claimed_by))

    @property
    def sync_sessions(self) -> sessionmaker[AttemptSession]:
        """Sessions on a synchronous engine for the same database, built on first use."""
        if self._sync_sessions is None:
            engine = sa.create_engine(
                sync_url(self.engine.url.render_as_string(hide_password=False)),
                **self.dialect.sync_engine_options(),
            )
            self.dialect.configure_sync_engine(engine)
            self._sync_engine = engine
            self._sync_sessions = sessionmaker(
                engine, class_=AttemptSession, expire_on_commit=False
            )
        return self._sync_sessions

    def claim_effect_sync(self, session: Session, job: str, key: str, claimed_by: str) -> bool:
        """`claim_effect` on a synchronous session."""
        with self.translate():
            return run(session, claim_plan(self.dialect, job, key, claimed_by))

    def claim_in_sync(self, session: Session, job: str, key: str) -> Claim | None:
        """The committed claim of a key, read in the given synchronous session."""
        with self.translate():
            return run(session, claim_in_plan(job, key))

    def finish_sync(self, session: Session, job: str, key: str) -> None:
        """`finish` on a synchronous session: stamp the end, commit work and claim together."""
        with self.translate():
            run(session, finish_plan(self.dialect, job, key))
            hooks.before_commit(job, key)
            hand_back(session)
            session.commit()

    def abandon_sync(self, session: Session) -> None:
        """Roll a synchronous attempt back (claim included) and close its session."""
        hand_back(session)
        with contextlib.suppress(Exception):
            session.rollback()
        with contextlib.suppress(Exception):
            session.close()

    async def clear(self) -> int:
        """Delete every claim and every task (for test databases); how many claims there were."""
        with self.translate():
            async with self.engine.begin() as conn:
                await conn.execute(tasks_sql.clear())
                if self.has_task_errors:
                    await conn.execute(tasks_sql.clear_errors())
                return int((await conn.execute(sql.clear())).rowcount)

    # -- the ledger ---------------------------------------------------------------------

    async def history(self, job: str | None = None, limit: int = 50) -> list[Claim]:
        """Claims, newest first."""
        return [claim_from_row(r) for r in await self._read(sql.history(job, limit))]

    async def last_claims(self) -> dict[str, Claim]:
        """The newest claim of each job that has one."""
        return {r.job: claim_from_row(r) for r in await self._read(sql.last_claims())}

    async def get_claim(self, job: str, key: str) -> Claim | None:
        """The claim of one slot, if any."""
        rows = await self._read(sql.get_claim(job, key))
        return claim_from_row(rows[0]) if rows else None

    async def last_slots(self) -> dict[str, datetime]:
        """The newest claimed slot time of each job that has one (the worker's catch-up floor)."""
        rows = await self._read(sql.last_slots())
        return {r.job: r.slot for r in rows if r.slot is not None}

    async def database_time(self) -> datetime:
        """The database's clock (Postgres `clock_timestamp()`); SQLite has none: this host's."""
        value = self.dialect.now()
        if isinstance(value, datetime):
            return value
        with self.translate():
            async with self._reader() as conn:
                now = (await conn.execute(sa.select(value))).scalar_one()
                await conn.rollback()
        assert isinstance(now, datetime)
        return now

    def is_busy(self, exc: BaseException) -> bool:
        """Whether an error (or the driver error it was translated from) means another
        transaction held the lock a statement needed (SQLite's write lock): worth a retry."""
        return self.dialect.is_busy(exc.__cause__ or exc)

    def listen(
        self,
        on_notify: Callable[[str], None],
        *,
        engine: AsyncEngine | None = None,
        on_lost: Callable[[], None] | None = None,
        prober: AsyncEngine | None = None,
    ) -> contextlib.AbstractAsyncContextManager[bool]:
        """Call `on_notify(key)` (see Dialect.listener) whenever tasks are enqueued, while
        the context is open (on a connection of `engine`, default the store's), and
        `on_lost()` if that connection goes away; yields whether notifications work (a
        probe, sent on a connection of `prober`, default `engine`, came back: without them
        a worker relies on polling alone)."""
        return self.dialect.listener(engine or self.engine, on_notify, on_lost, prober)

    async def enqueue(
        self, entries: Sequence[dict[str, Any]]
    ) -> tuple[list[TaskRecord], bool | None]:
        """Insert tasks in a transaction of their own, committed on return (a producer with
        no transaction to join: the CLI, a test); see `task_store.enqueue` for `entries`.

        With the records, whether they committed: True; or, when the connection was lost
        during COMMIT, what reading the first new task back says (False: rolled back; None:
        it cannot be read, the outcome is unknown). A lost COMMIT of duplicates only, which
        inserted nothing, raises DatabaseUnavailableError.
        """
        await self.ensure_schema()
        async with AsyncSession(self.engine) as db:
            with self.translate():
                await db.begin()
                records = await task_store.enqueue(db, entries)
                # What a lost COMMIT's fate is asked by (Postgres; one more round trip on
                # this path of producers without a transaction of their own).
                xid = await self.dialect.xact_id(db)
            try:
                with self.translate():
                    await db.commit()
            except DatabaseUnavailableError:
                new = [rec for rec in records if not rec.duplicate]
                if not new:
                    raise  # nothing was inserted: a lost COMMIT changed nothing
                return records, await task_landed(self, new[0].id, xid)
        return records, True

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a transaction of its own on this database, committed on a normal
        exit: for an application's own tables beside oncely's (a demo's data, a fixture)."""
        with self.translate():
            async with self.engine.begin() as conn:
                yield conn

    def is_unavailable(self, exc: BaseException) -> bool:
        """Whether an error a job's attempt died of means the database itself is unreachable."""
        if isinstance(exc, DatabaseUnavailableError):
            return True
        if isinstance(exc, sa.exc.DBAPIError) or self.dialect.is_driver_error(exc):
            return isinstance(self._translated(exc), DatabaseUnavailableError)
        return isinstance(exc, (OSError, asyncio.TimeoutError, ConnectionError))

    async def release(self, job: str, key: str) -> Claim | None:
        """Delete one claim so its slot can run again; the claim that was deleted, if any.

        Refused (BadInputError) while an attempt at the slot is running, on both databases:
        its claim is not committed yet, and deleting what is there would change nothing.
        """
        running = BadInputError(
            f"job {job!r} key {key!r} is running right now (or, on SQLite, another write "
            "holds the database): nothing released; try again when it has finished"
        )
        with self.translate():
            try:
                async with self.engine.connect() as conn:
                    conn = await conn.execution_options(
                        **self.dialect.busy_options(RELEASE_BUSY_MS)
                    )
                    async with conn.begin():
                        if not await self.dialect.try_lock_slot(conn, job, key):
                            raise running
                        row = (await conn.execute(sql.release(job, key))).first()
            except sa.exc.OperationalError as exc:
                if self.dialect.is_busy(exc):
                    raise running from None
                raise
        return claim_from_row(row) if row is not None else None

    @contextlib.asynccontextmanager
    async def _reader(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as conn:
            yield await conn.execution_options(**self.dialect.read_only_options())

    async def _read(self, stmt: Any) -> list[Any]:
        await self.ensure_schema()
        with self.translate():
            async with self._reader() as conn:
                rows = list((await conn.execute(stmt)).all())
                await conn.rollback()
        return rows


def _driver_message(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else ""
