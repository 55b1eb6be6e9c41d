"""oncely's schema, as numbered steps; `migrate` applies the ones a database lacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

from .dialects import dialect_for
from .tables import runs, tasks


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


def _v4_failed_index(conn: Connection) -> None:
    # The newest dead (or discarded) tasks straight from an index of those alone. Building it
    # reads the whole table and locks out writes to oncely_tasks meanwhile (about 3 s for
    # 5 million rows); see docs/scale.md.
    for index in tasks.indexes:
        if index.name == "oncely_tasks_failed":
            index.create(conn, checkfirst=True)


Step = Callable[[Connection], Any]

MIGRATIONS: list[tuple[int, str, Step]] = [
    (1, "the oncely_runs ledger", _v1_runs),
    (2, "the oncely_tasks queue (and its NOTIFY trigger on Postgres)", _v2_tasks),
    (3, "oncely_tasks: partial indexes for keyed and finished tasks", _v3_lean_indexes),
    (4, "oncely_tasks: a partial index for listing dead and discarded tasks", _v4_failed_index),
]
"""(version, what it adds, step); append only, never edit a released step."""

LATEST = MIGRATIONS[-1][0]

REQUIRED = 2
"""The oldest schema this oncely runs on. v3 changes only indexes, and this oncely's
statements work with v2's as well: upgrade every process first, then `oncely migrate` (an
older oncely cannot enqueue on v3, whose key index its conflict target does not name). v4
adds an index only: every statement runs on v3 as on v4."""
