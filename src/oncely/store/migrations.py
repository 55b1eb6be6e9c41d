"""oncely's schema, as numbered steps; `migrate` applies the ones a database lacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

from .dialects import dialect_for
from .tables import attempts, audit, pauses, runs, task_cancels, tasks


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


def _v4_control(conn: Connection) -> None:
    # New tables only, nothing of v3 changes: this oncely runs on v2 and v3 without its
    # control plane (`Store.has_control`), so every process can be upgraded before migrating.
    for table in (attempts, pauses, audit, task_cancels):
        table.create(conn, checkfirst=True)


Step = Callable[[Connection], Any]

MIGRATIONS: list[tuple[int, str, Step]] = [
    (1, "the oncely_runs ledger", _v1_runs),
    (2, "the oncely_tasks queue (and its NOTIFY trigger on Postgres)", _v2_tasks),
    (3, "oncely_tasks: partial indexes for keyed and finished tasks", _v3_lean_indexes),
    (4, "the control plane: attempts, pauses, the audit trail, task cancel requests", _v4_control),
]
"""(version, what it adds, step); append only, never edit a released step."""

LATEST = MIGRATIONS[-1][0]

CONTROL = 4
"""The schema version that holds the control plane's tables (pause, attempts, audit, cancel):
on an older database the worker and `oncely run` work as before, without pauses or attempt
records, and the operator's commands ask for `oncely migrate`."""

REQUIRED = 2
"""The oldest schema this oncely runs on. v3 changes only indexes, and this oncely's
statements work with v2's as well: upgrade every process first, then `oncely migrate` (an
older oncely cannot enqueue on v3, whose key index its conflict target does not name)."""
