"""oncely's schema, as numbered steps; `migrate` applies the ones a database lacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

from . import sql
from .dialects import dialect_for
from .tables import runs, schema_versions, tasks, workers


def _v1_runs(conn: Connection) -> None:
    runs.create(conn, checkfirst=True)


def _v2_tasks(conn: Connection) -> None:
    tasks.create(conn, checkfirst=True)
    for statement in dialect_for(conn.dialect.name).tasks_ddl():
        conn.exec_driver_sql(statement)


def _v3_lean_indexes(conn: Connection) -> None:
    # The key index covers keyed tasks only, the state index finished tasks only: a task
    # without a key writes 7 index entries over its life (insert, lease, ack) instead of 12.
    # The new indexes are built before the old ones go, in the migration's one transaction,
    # so the key stays unique throughout. Building them locks out writes to oncely_tasks for
    # as long as it takes (seconds per million rows).
    for index in tasks.indexes:
        if index.name in ("oncely_tasks_key", "oncely_tasks_finished"):
            index.create(conn, checkfirst=True)
    conn.exec_driver_sql("DROP INDEX IF EXISTS oncely_tasks_idempotency")
    conn.exec_driver_sql("DROP INDEX IF EXISTS oncely_tasks_state")


def _v4_workers(conn: Connection) -> None:
    workers.create(conn, checkfirst=True)


Step = Callable[[Connection], Any]

MIGRATIONS: list[tuple[int, str, Step]] = [
    (1, "the oncely_runs ledger", _v1_runs),
    (2, "the oncely_tasks queue (and its NOTIFY trigger on Postgres)", _v2_tasks),
    (3, "oncely_tasks: partial indexes for keyed and finished tasks", _v3_lean_indexes),
    (4, "oncely_workers: live task workers and the task names they lease", _v4_workers),
]
"""(version, what it adds, step); append only, never edit a released step."""

LATEST = MIGRATIONS[-1][0]

REQUIRED = 2
"""The oldest schema this oncely runs on. v3 changes only indexes, and this oncely's
statements work with v2's as well: upgrade every process first, then `oncely migrate` (an
older oncely cannot enqueue on v3, whose key index its conflict target does not name)."""


def apply_migrations(conn: Connection, too_new: Callable[[int], Exception]) -> list[int]:
    """Apply the migrations the database lacks, in the connection's open transaction (which
    the caller commits); the versions applied. `too_new(version)` is raised for a schema
    newer than LATEST. `oncely migrate` and the Django app's migration both run this."""
    dialect = dialect_for(conn.dialect.name)
    lock = dialect.migration_lock()
    if lock is not None:
        conn.execute(*lock)
    schema_versions.create(conn, checkfirst=True)
    current = conn.execute(sql.schema_version()).scalar() or 0
    if current > LATEST:
        raise too_new(current)
    applied: list[int] = []
    for version, _what, step in MIGRATIONS:
        if version > current:
            step(conn)
            conn.execute(sql.record_version(version, dialect.now()))
            applied.append(version)
    return applied
