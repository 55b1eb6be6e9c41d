"""The driver's own connection under a session, for code that asks for it.

A task, job or effect body gets an `AsyncSession`; its statements go through SQLAlchemy
(compilation, the cursor adapter, the result). On Postgres with asyncpg, a body may ask for
the asyncpg connection under its session instead and send its statements on it: the same
transaction, without SQLAlchemy's per-statement work (docs/tasks.md, "The driver's
connection"; its measurements in docs/design/task-execution.md, "Where a one-row task goes").
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from ..errors import ConfigError
from .dialects import dialect_for
from .session import driver_lender


async def asyncpg_connection(session: AsyncSession) -> Any:
    """The asyncpg connection under `session`, inside the session's transaction (begun here,
    as SQLAlchemy begins it, if the session has made no statement yet).

    What is sent on it commits or rolls back with the session's own work: in a task, with its
    ack; in a job, with its claim; in a group of tasks, inside the task's savepoint. It is the
    session's connection, lent: never COMMIT, ROLLBACK, SAVEPOINT or close on it, and keep no
    reference to it after the body returns. The session's pending objects are flushed first.
    Raises ConfigError where there is no such connection (SQLite, psycopg, a session in
    autocommit mode).
    """
    if not isinstance(session, AsyncSession):
        raise ConfigError(
            "asyncpg_connection() takes an AsyncSession (an async task's, job's or effect's"
            f" session), not {type(session).__name__}"
        )
    sync = session.sync_session
    lend = driver_lender(sync)
    if lend is not None and not (sync.new or sync.deleted or sync.identity_map.check_modified()):
        # A task's, with nothing to flush first: its transaction (or in a group, its
        # savepoint) is held on the driver, begun here if the task made no statement yet; the
        # session need not begin on it.
        driver = await lend()
        if driver is not None:
            return driver
    bind = await session.connection()
    name = f"{bind.dialect.name}+{bind.dialect.driver}"
    driver = await dialect_for(bind.dialect.name).session_driver(session, bind)
    if driver is None or not driver.is_in_transaction():
        where = "in autocommit mode" if driver is not None else f"on {name}"
        raise ConfigError(
            f"asyncpg_connection() needs a session in a transaction on postgresql+asyncpg;"
            f" this one runs {where}: use the session itself"
        )
    return driver
