"""The database core every area of the store shares: one database's engine and dialect, the
translation of its errors, read-only reads, and the schema version it is at.

Driver and SQLAlchemy errors do not leave the store except as the cause of an OncelyError: an
unreachable database becomes DatabaseUnavailableError (URL shown with its credentials masked), a
missing table SchemaMissingError. The areas (claims, tasks, control, views) are each handed
this core; none of them holds the `Store`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool, QueuePool

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
from . import sql
from .dialects import dialect_for
from .migrations import (
    ACK_FUNCTION,
    COMPATIBLE_UP_TO,
    CONTROL,
    DUPLICATES,
    JOBS,
    LATEST,
    REQUIRED,
    SCHEDULE_LEASES,
    SCHEDULES,
    SLOT_FATE,
    TASK_ERRORS,
    apply_migrations,
)
from .session import AttemptSession
from .task_connections import TaskPool
from .urls import sync_url

CONTROL_WAIT_S = 3600.0
"""How long a worker's statement may wait for its control connection (held by the others,
one statement at a time)."""
CONTROL_PING_AFTER_IDLE_S = 60.0
"""Seconds the control connection may stay idle before its next use pings it (a ping is
three round trips: on an idle worker's every look for tasks, more than the look)."""


class Database:
    """One database's engine and dialect: what every area of the store runs its statements
    through."""

    def __init__(self, engine: AsyncEngine, *, owns_engine: bool) -> None:
        self.engine = engine
        self.dialect = dialect_for(engine.dialect.name)
        self.owns_engine = owns_engine
        self._schema_checked = False
        self._version: int | None = None
        self._sync_engine: sa.Engine | None = None
        self._sync_sessions: sessionmaker[AttemptSession] | None = None

    def dedicated_engine(self) -> AsyncEngine:
        """An engine whose connections are opened for one holder each (a worker's listener,
        which keeps its own for its lifetime; a lost COMMIT's read-back, which must not read
        on a pooled one); a user's own engine is shared as it is."""
        if not self.owns_engine:
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
        if not self.owns_engine or not isinstance(self.engine.sync_engine.pool, QueuePool):
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

    @property
    def has_schedules(self) -> bool:
        """Whether the database has oncely_schedules (schema 17)."""
        return self._version is not None and self._version >= SCHEDULES

    @property
    def has_schedule_leases(self) -> bool:
        """Whether oncely_schedules carries a lease on due rows (schema 19)."""
        return self._version is not None and self._version >= SCHEDULE_LEASES

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
        if self.owns_engine:
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
                async with self.reader() as conn:
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

    async def database_time(self) -> datetime:
        """The database's clock (Postgres `clock_timestamp()`); SQLite has none: this host's."""
        value = self.dialect.now()
        if isinstance(value, datetime):
            return value
        with self.translate():
            async with self.reader() as conn:
                now = (await conn.execute(sa.select(value))).scalar_one()
                await conn.rollback()
        assert isinstance(now, datetime)
        return now

    def is_busy(self, exc: BaseException) -> bool:
        """Whether an error (or the driver error it was translated from) means another
        transaction held the lock a statement needed (SQLite's write lock): worth a retry."""
        return self.dialect.is_busy(exc.__cause__ or exc)

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

    # -- reads ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.connect() as conn:
            yield await conn.execution_options(**self.dialect.read_only_options())

    async def read(self, stmt: Any) -> list[Any]:
        """The rows of a read-only statement, on a connection of its own, once the schema is
        known to be one this oncely runs on."""
        await self.ensure_schema()
        with self.translate():
            async with self.reader() as conn:
                rows = list((await conn.execute(stmt)).all())
                await conn.rollback()
        return rows


def _driver_message(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else ""
