"""oncely's statements on a DB-API connection it borrows, inside its owner's transaction.

A framework with a connection of its own (Django) runs oncely's claim, its enqueue and its
migration on that connection, so that they commit with the framework's work or not at all.
The connection is lent to a SQLAlchemy Connection through a stand-in whose commit, rollback
and close do nothing: the transaction stays its owner's, and oncely's statements (the same
named statements and plans as everywhere, with their bound parameters and type conversions)
run inside it. Nothing here knows the framework: it is handed the DB-API connection.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from ..identity import replica_id
from ..model import Claim, TaskRecord
from . import task_queue
from .claims import claim_in_plan, claim_plan, fate_plan, finish_plan
from .dialect import ClaimAnswer, ClaimRequest, Dialect, raise_translated
from .dialects import dialect_for
from .migrations import apply_migrations
from .plan import run


class _Lent:
    """A DB-API connection as its owner lends it: statements pass, the transaction does not.

    SQLAlchemy's connect hooks would change the owner's connection for good: the dialect
    files give drivers without them (`Dialect.foreign_driver`), and these stand-ins catch
    any that remain.
    """

    def __init__(self, dbapi_connection: Any, dialect: Dialect) -> None:
        self._conn = dbapi_connection
        self._dialect = dialect

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return self._dialect.foreign_cursor(self._conn.cursor(*args, **kwargs))

    def commit(self) -> None:
        """The owner's to do."""

    def rollback(self) -> None:
        """The owner's to do."""

    def close(self) -> None:
        """The owner's to do."""

    def create_function(self, *args: Any, **kwargs: Any) -> None:
        """Not on the owner's connection (SQLAlchemy's SQLite functions)."""

    def add_notice_handler(self, *args: Any, **kwargs: Any) -> None:
        """Not on the owner's connection (SQLAlchemy's psycopg notice logging)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


_lending = threading.local()
_engines: dict[tuple[str, str], sa.Engine] = {}
_engines_lock = threading.Lock()


def _lent() -> _Lent:
    conn: _Lent = _lending.conn
    return conn


def _engine(name: str, driver: str) -> sa.Engine:
    """One engine per database kind and driver, whose connections are the one being lent by
    this thread (its dialect is set up once, on the first connection lent)."""
    with _engines_lock:
        engine = _engines.get((name, driver))
        if engine is None:
            options: dict[str, Any] = {"use_native_hstore": False} if name == "postgresql" else {}
            engine = sa.create_engine(
                f"{name}+{driver}://",
                creator=_lent,
                poolclass=NullPool,
                pool_reset_on_return=None,
                **options,
            )
            _engines[(name, driver)] = engine
        return engine


@contextlib.contextmanager
def borrow(dbapi_connection: Any, name: str) -> Iterator[Connection]:
    """A SQLAlchemy Connection on `dbapi_connection` (of database `name`: "postgresql" or
    "sqlite"), inside the transaction its owner has open; it never commits or rolls back."""
    dialect = dialect_for(name)
    engine = _engine(name, dialect.foreign_driver(dbapi_connection))
    previous = getattr(_lending, "conn", None)
    _lending.conn = _Lent(dbapi_connection, dialect)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        _lending.conn = previous


def _dialect(conn: Connection) -> Dialect:
    return dialect_for(conn.dialect.name)


def claim(conn: Connection, job: str, key: str, claimed_by: str | None = None) -> bool:
    """Claim (job, key) in the owner's open transaction; True if the claim is ours. Waits
    for a concurrent holder of the key, like `claim_run`."""
    dialect = _dialect(conn)
    try:
        return run(conn, claim_plan(dialect, job, key, claimed_by or replica_id()))
    except DBAPIError as exc:
        raise_translated(dialect, exc)


def lock_and_claim(conn: Connection, request: ClaimRequest) -> ClaimAnswer:
    """A slot attempt's claim in the owner's open transaction, without waiting for another
    attempt at the slot (Postgres: a try-lock; SQLite: BUSY if the write lock is held)."""
    dialect = _dialect(conn)
    try:
        return run(conn, dialect.lock_and_claim_plan(request))
    except DBAPIError as exc:
        if dialect.is_busy(exc):
            return ClaimAnswer.BUSY
        raise_translated(dialect, exc)


def give_up(
    conn: Connection, job: str, key: str, record: Callable[[int, Any], tuple[Any, Any]]
) -> None:
    """A failed slot attempt's end in the owner's open transaction, which still holds the slot
    (see `claims.fate_plan`); the owner's commit lands it."""
    dialect = _dialect(conn)
    try:
        run(conn, fate_plan(dialect, job, key, record))
    except DBAPIError as exc:
        raise_translated(dialect, exc)


def claim_in(conn: Connection, job: str, key: str) -> Claim | None:
    """The committed claim of (job, key), as the owner's transaction sees it."""
    dialect = _dialect(conn)
    try:
        return run(conn, claim_in_plan(job, key))
    except DBAPIError as exc:
        raise_translated(dialect, exc)


def finish(conn: Connection, job: str, key: str) -> None:
    """Stamp the end of the run claimed as (job, key); the owner's commit lands it."""
    dialect = _dialect(conn)
    try:
        run(conn, finish_plan(dialect, job, key))
    except DBAPIError as exc:
        raise_translated(dialect, exc)


def enqueue(conn: Connection, entries: Sequence[dict[str, Any]]) -> list[TaskRecord]:
    """Insert tasks in the owner's open transaction (see `task_queue.enqueue` for `entries`):
    they exist iff the owner commits."""
    with Session(bind=conn) as session:
        return task_queue.enqueue_sync(session, entries)


def execute(conn: Connection, statement: Any, params: Any = None) -> Any:
    """One statement (a named statement, or SQL text with :name parameters) in the owner's
    open transaction; its result."""
    if isinstance(statement, str):
        statement = sa.text(statement)
    return conn.execute(statement, params)


def migrate(conn: Connection, too_new: Any) -> list[int]:
    """`oncely migrate`'s steps in the owner's open transaction; the versions applied."""
    return apply_migrations(conn, too_new)
