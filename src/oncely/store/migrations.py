"""oncely's schema, as numbered steps; `migrate` applies the ones a database lacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import sql
from .dialects import dialect_for
from .tables import (
    attempts,
    audit,
    duplicates,
    jobs,
    pauses,
    runs,
    schedules,
    schema_versions,
    task_cancels,
    task_errors,
    task_starts,
    tasks,
    workers,
)


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


_V4_COLUMNS = (
    "priority",
    "concurrency_key",
    "concurrency",
    "rate_key",
    "rate",
    "rate_period",
    "result",
)
_V4_INDEXES = (
    "oncely_tasks_next",
    "oncely_tasks_next_by_queue",
    "oncely_tasks_next_limited",
    "oncely_tasks_limited_running",
)


def _v4_limits(conn: Connection) -> None:
    # Priorities, limits and results: new nullable columns (priority defaults to 0, so no
    # row is rewritten on Postgres 11+), the lease-order indexes in place of the due ones,
    # and the table of recent starts that rate limits count. A database that v2 created
    # from this release's tables has them all already: only what is missing is added.
    present = {c["name"] for c in sa.inspect(conn).get_columns("oncely_tasks")}
    for name in _V4_COLUMNS:
        if name not in present:
            column = sa.schema.CreateColumn(tasks.c[name]).compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE oncely_tasks ADD COLUMN {column}")
    for index in tasks.indexes:
        if index.name in _V4_INDEXES:
            index.create(conn, checkfirst=True)
    conn.exec_driver_sql("DROP INDEX IF EXISTS oncely_tasks_due")
    conn.exec_driver_sql("DROP INDEX IF EXISTS oncely_tasks_due_by_queue")
    task_starts.create(conn, checkfirst=True)


def _v5_workers(conn: Connection) -> None:
    workers.create(conn, checkfirst=True)


def _v6_control(conn: Connection) -> None:
    # New tables only: this oncely runs on v4 and v5 without its
    # control plane (`Store.has_control`), so every process can be upgraded before migrating.
    for table in (attempts, pauses, audit, task_cancels):
        table.create(conn, checkfirst=True)


def _v7_failed_index(conn: Connection) -> None:
    # The newest dead (or discarded) tasks straight from an index of those alone. Building it
    # reads the whole table and locks out writes to oncely_tasks meanwhile (about 3 s for
    # 5 million rows); see docs/scale.md.
    for index in tasks.indexes:
        if index.name == "oncely_tasks_failed":
            index.create(conn, checkfirst=True)


def _v8_duplicates(conn: Connection) -> None:
    # A new table only: an older oncely runs on v8 (it records no duplicates).
    duplicates.create(conn, checkfirst=True)


def _v9_trace_context(conn: Connection) -> None:
    # One nullable column, no default: no row is rewritten, on Postgres or SQLite. A database
    # that an earlier step created from this release's tables has it already.
    present = {c["name"] for c in sa.inspect(conn).get_columns("oncely_tasks")}
    if "trace_context" not in present:
        column = sa.schema.CreateColumn(tasks.c.trace_context).compile(dialect=conn.dialect)
        conn.exec_driver_sql(f"ALTER TABLE oncely_tasks ADD COLUMN {column}")


_V10_INDEXES = ("oncely_tasks_available_at", "oncely_runs_job_slot")


def _v10_indexes(conn: Connection) -> None:
    # Available tasks by run_at: an idle worker asks when the next one comes due, instead
    # of polling. Claims by (job, slot): the newest slot of each job without reading the
    # whole ledger. Building them locks out writes to the two tables meanwhile (about a
    # second per million claims, a fraction of one per 100,000 waiting tasks).
    for index in (*tasks.indexes, *runs.indexes):
        if index.name in _V10_INDEXES:
            index.create(conn, checkfirst=True)


def _v11_task_errors(conn: Connection) -> None:
    # A new table only: this oncely runs on v9 and v10 without it (`Store.has_task_errors`):
    # their failed attempts keep only the last error, on the task row, as before.
    task_errors.create(conn, checkfirst=True)


def _v12_wake(conn: Connection) -> None:
    # The NOTIFY trigger's function only (Postgres): its notification names the enqueueing
    # transaction. An older oncely ignores the payload; this one runs on v11 without it (the
    # workers then take turns by the sender's process id).
    for statement in dialect_for(conn.dialect.name).wake_ddl():
        conn.exec_driver_sql(statement)


def _v13_ack(conn: Connection) -> None:
    # A function only (Postgres): a task's ack, planned once per connection instead of at
    # every task. This oncely acks as before on v12 (`Store.has_ack_function`).
    for statement in dialect_for(conn.dialect.name).ack_ddl():
        conn.exec_driver_sql(statement)


def _v14_slot_fate(conn: Connection) -> None:
    # Two nullable columns, no default (no row rewritten), and a partial index of the few
    # attempts they mark (none yet). A release of schema 13 refuses v14 (it is newer than
    # what it knows); every release from this one on reads the marks in its claim.
    present = {c["name"] for c in sa.inspect(conn).get_columns("oncely_attempts")}
    for name in ("final", "retry_at"):
        if name not in present:
            column = sa.schema.CreateColumn(attempts.c[name]).compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE oncely_attempts ADD COLUMN {column}")
    for index in attempts.indexes:
        if index.name == "oncely_attempts_marked":
            index.create(conn, checkfirst=True)


def _v16_jobs(conn: Connection) -> None:
    # A new table only: an older oncely runs on v16 (it records no first appearances, and
    # `oncely verify` then dates a job from its oldest claim in the window).
    jobs.create(conn, checkfirst=True)


def _v17_schedules(conn: Connection) -> None:
    # A new table and its index only: an older oncely runs on v17 (it runs no data schedules).
    schedules.create(conn, checkfirst=True)


def _v18_notify_setting(conn: Connection) -> None:
    # The NOTIFY trigger's function only (Postgres): it sends nothing where the server setting
    # `oncely.notify` is `off`. An older oncely runs on v18 (while the setting is unset, the
    # trigger sends as before; set, an older worker finds new tasks at its listening look).
    for statement in dialect_for(conn.dialect.name).notify_setting_ddl():
        conn.exec_driver_sql(statement)


def _v19_leases(conn: Connection) -> None:
    # Two nullable columns, no default: no row is rewritten. An older oncely runs on v19 (it
    # reads the due rows without a lease, as before; the claim still decides each slot).
    present = {c["name"] for c in sa.inspect(conn).get_columns("oncely_schedules")}
    for column in (schedules.c.leased_until, schedules.c.leased_by):
        if column.name not in present:
            ddl = sa.schema.CreateColumn(column).compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE oncely_schedules ADD COLUMN {ddl}")


Step = Callable[[Connection], Any]

MIGRATIONS: list[tuple[int, str, Step]] = [
    (1, "the oncely_runs ledger", _v1_runs),
    (2, "the oncely_tasks queue (and its NOTIFY trigger on Postgres)", _v2_tasks),
    (3, "oncely_tasks: partial indexes for keyed and finished tasks", _v3_lean_indexes),
    (4, "oncely_tasks: priorities, concurrency and rate limits, results", _v4_limits),
    (5, "oncely_workers: live task workers and the task names they lease", _v5_workers),
    (6, "the control plane: attempts, pauses, the audit trail, task cancel requests", _v6_control),
    (7, "oncely_tasks: a partial index for listing dead and discarded tasks", _v7_failed_index),
    (8, "oncely_duplicates: suppressed duplicate slot attempts", _v8_duplicates),
    (9, "oncely_tasks: the trace context of the code that enqueued each task", _v9_trace_context),
    (10, "indexes: available tasks by run_at, claims by (job, slot)", _v10_indexes),
    (11, "oncely_task_errors: every failed task attempt's error", _v11_task_errors),
    (12, "the NOTIFY trigger names the enqueueing transaction (workers take turns)", _v12_wake),
    (13, "oncely_task_ack(): a task's ack, planned once per connection", _v13_ack),
    (14, "oncely_attempts: a slot's given-up mark and retry time", _v14_slot_fate),
    (
        16,
        "oncely_jobs: when each job first appeared (what `oncely verify` dates it from)",
        _v16_jobs,
    ),
    (17, "oncely_schedules: schedules kept as data, found by their next slot", _v17_schedules),
    (18, "the NOTIFY trigger sends nothing where `oncely.notify` is off", _v18_notify_setting),
    (
        19,
        "oncely_schedules: a short lease on a due row, one worker at a time",
        _v19_leases,
    ),
]
"""(version, what it adds, step); append only, never edit a released step."""

LATEST = MIGRATIONS[-1][0]

BREAKING_STEP = 100
"""The rule that lets a release run on a newer schema (an upgrade's rollout, a process of the
previous release restarting after `oncely migrate`): every migration after 13 is additive —
new tables, nullable or defaulted columns, indexes, functions; no column, index, value or
meaning that an older release's statements rely on is taken away or changed — unless it is
listed in BREAKING, and a breaking migration takes the next multiple of BREAKING_STEP as its
number. So a release runs on any schema up to the version before that multiple
(COMPATIBLE_UP_TO), and refuses one from a breaking migration on."""

BREAKING: frozenset[int] = frozenset({3})
"""The migrations an older release cannot run on (3: an older enqueue names the idempotency
index that 3 drops). From 14 on, each is a multiple of BREAKING_STEP."""

COMPATIBLE_UP_TO = (LATEST // BREAKING_STEP + 1) * BREAKING_STEP - 1
"""The newest schema this release runs on: LATEST, and the additive migrations that later
releases may add before the next breaking one."""

CONTROL = 6
"""The schema version that holds the control plane's tables (pause, attempts, audit, cancel):
on an older database the worker and `oncely run` work as before, without pauses or attempt
records, and the operator's commands ask for `oncely migrate`."""

DUPLICATES = 8
"""The schema version that holds oncely_duplicates: older databases record no duplicates."""

TASK_ERRORS = 11
"""The schema version that holds oncely_task_errors: older databases keep only each task's
last error (on its row), and record no history."""

ACK_FUNCTION = 13
"""The schema version that holds oncely_task_ack() (Postgres): older databases get the ack as
a statement of its own, planned at every task."""

SLOT_FATE = 14
"""The schema version whose attempts carry a slot's fate (`final`, `retry_at`)."""

JOBS = 16
"""The schema version that holds oncely_jobs: older databases record no first appearances."""

SCHEDULES = 17
"""The schema version that holds oncely_schedules: older databases have no data schedules."""

SCHEDULE_LEASES = 19
"""The schema version whose schedules carry a lease (Postgres reads the due rows with FOR
UPDATE SKIP LOCKED and leases them): older databases read them without one."""

REQUIRED = 14
"""The oldest schema this oncely runs on. v4, v9 and v14 add columns that this oncely's
enqueue, lease and claim statements name: run `oncely migrate` first, then upgrade the
processes (an older oncely runs on v14: its statements leave the new columns at their
defaults)."""


def apply_migrations(conn: Connection, too_new: Callable[[int], Exception]) -> list[int]:
    """Apply the migrations the database lacks, in the connection's open transaction (which
    the caller commits); the versions applied. `too_new(version)` is raised for a schema
    newer than COMPATIBLE_UP_TO; a newer schema up to it needs nothing (a later release's
    additive migrations). `oncely migrate` and the Django app's migration both run this."""
    dialect = dialect_for(conn.dialect.name)
    lock = dialect.migration_lock()
    if lock is not None:
        conn.execute(*lock)
    schema_versions.create(conn, checkfirst=True)
    current = conn.execute(sql.schema_version()).scalar() or 0
    if current > COMPATIBLE_UP_TO:
        raise too_new(current)
    applied: list[int] = []
    for version, _what, step in MIGRATIONS:
        if version > current:
            step(conn)
            conn.execute(sql.record_version(version, dialect.now()))
            applied.append(version)
    return applied


def applied_from(version: int) -> list[int]:
    """The versions `migrate` applies to a database at `version - 1`, in order."""
    return [v for v, _what, _step in MIGRATIONS if v >= version]
