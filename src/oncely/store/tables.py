"""oncely's tables, as one SQLAlchemy MetaData that Alembic users can include."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from ..errors import BadTimeError

metadata = sa.MetaData()


class UTCDateTime(TypeDecorator[datetime]):
    """An instant: timestamptz on Postgres; naive-UTC text on SQLite, read back as aware UTC."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise BadTimeError("oncely stores only timezone-aware instants")
        if dialect.name == "sqlite":
            return value.astimezone(timezone.utc).replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


runs = sa.Table(
    "oncely_runs",
    metadata,
    sa.Column("job", sa.String(200), primary_key=True),
    sa.Column("key", sa.String(200), primary_key=True),
    sa.Column("scheduled_for", UTCDateTime(), nullable=True),
    sa.Column("claimed_at", UTCDateTime(), nullable=False),
    sa.Column("claimed_by", sa.String(255), nullable=False),
    sa.Column("finished_at", UTCDateTime(), nullable=True),
    comment="One row per claimed slot: the ledger that makes a job's effects happen once.",
)
sa.Index("oncely_runs_job_claimed_at", runs.c.job, runs.c.claimed_at)
sa.Index("oncely_runs_claimed_at", runs.c.claimed_at)
# The newest slot of each job, where a starting worker's catch-up looks back from (schema v10).
sa.Index("oncely_runs_job_slot", runs.c.job, runs.c.scheduled_for)

schema_versions = sa.Table(
    "oncely_schema",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("applied_at", UTCDateTime(), nullable=False),
    comment="Which of oncely's migrations have been applied.",
)

_TASK_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: the rowid alias
_TASK_ARGS = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

tasks = sa.Table(
    "oncely_tasks",
    metadata,
    sa.Column("id", _TASK_ID, primary_key=True, autoincrement=True),
    sa.Column("task", sa.String(200), nullable=False),
    sa.Column("queue", sa.String(100), nullable=False),
    sa.Column("args", _TASK_ARGS, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("run_at", UTCDateTime(), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("idempotency_key", sa.String(255), nullable=True),
    sa.Column("lease_token", sa.String(64), nullable=True),
    sa.Column("locked_by", sa.String(255), nullable=True),
    sa.Column("started_at", UTCDateTime(), nullable=True),
    sa.Column("lease_expires_at", UTCDateTime(), nullable=True),
    sa.Column("finished_at", UTCDateTime(), nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    # Schema v4: lease order, limits (copied from the task's registration at enqueue, so
    # every worker enforces the same ones) and the return value.
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("concurrency_key", sa.String(255), nullable=True),
    sa.Column("concurrency", sa.Integer, nullable=True),
    sa.Column("rate_key", sa.String(255), nullable=True),
    sa.Column("rate", sa.Integer, nullable=True),
    sa.Column("rate_period", sa.Float, nullable=True),
    sa.Column("result", sa.Text, nullable=True),
    # Schema v9: the trace context of the code that enqueued the task (the propagator's
    # headers as JSON, e.g. W3C traceparent), so that its attempts continue that trace.
    sa.Column("trace_context", sa.Text, nullable=True),
    comment="One row per queued task; its state changes commit with the task's own work.",
)

task_starts = sa.Table(
    "oncely_task_starts",
    metadata,
    sa.Column("task", sa.String(200), nullable=False),
    sa.Column("key", sa.String(255), nullable=False),
    sa.Column("started_at", UTCDateTime(), nullable=False),
    sa.Column("expires_at", UTCDateTime(), nullable=False),
    comment="Recent attempt starts of rate-limited tasks (schema v4): what a rate counts.",
)
sa.Index("oncely_task_starts_key", task_starts.c.task, task_starts.c.key, task_starts.c.expires_at)


def _partial_index(name: str, *columns: Any, where: Any, unique: bool = False) -> sa.Index:
    """An index of the rows `where` holds for, the same on Postgres and SQLite."""
    return sa.Index(name, *columns, unique=unique, postgresql_where=where, sqlite_where=where)


# An idempotency key is unique per task among all retained rows, whatever their state. Tasks
# without a key have no entry (schema v3): most tasks add nothing here when enqueued, leased
# or acked. Conflict targets name the predicate (`task_queue_sql.KEYED`) to infer this index.
_KEYED = tasks.c.idempotency_key.is_not(None)
_partial_index("oncely_tasks_key", tasks.c.task, tasks.c.idempotency_key, where=_KEYED, unique=True)
# What a worker fetches: due, available tasks (of its queues) in lease order: highest
# priority first, then oldest (schema v4). Tasks with a limit have an index of their own, so
# that a lease takes the free ones in one index scan and looks at the limited ones apart.
_AVAILABLE = tasks.c.state == "available"
LIMITED = sa.or_(tasks.c.concurrency.is_not(None), tasks.c.rate.is_not(None))
"""The tasks that a concurrency or a rate limit holds back (the predicate of their index)."""
UNLIMITED = sa.and_(tasks.c.concurrency.is_(None), tasks.c.rate.is_(None))
LEASE_ORDER = (tasks.c.priority.desc(), tasks.c.run_at, tasks.c.id)
_partial_index("oncely_tasks_next", *LEASE_ORDER, where=sa.and_(_AVAILABLE, UNLIMITED))
_partial_index(
    "oncely_tasks_next_by_queue", tasks.c.queue, *LEASE_ORDER, where=sa.and_(_AVAILABLE, UNLIMITED)
)
_partial_index("oncely_tasks_next_limited", *LEASE_ORDER, where=sa.and_(_AVAILABLE, LIMITED))
# Available tasks by the time they come due (schema v10): when an idle worker that
# notifications wake must look again (`task_queue_sql.next_due`), without a poll.
_partial_index("oncely_tasks_available_at", tasks.c.run_at, where=_AVAILABLE)
# Live leases of tasks with a concurrency limit, by limit group: what a lease counts.
_partial_index(
    "oncely_tasks_limited_running",
    tasks.c.task,
    tasks.c.concurrency_key,
    where=sa.and_(tasks.c.state == "running", tasks.c.concurrency.is_not(None)),
)
# What the rescuer looks at: leases that may have run out.
_partial_index("oncely_tasks_leases", tasks.c.lease_expires_at, where=tasks.c.state == "running")
# Finished tasks by state and end (what prune deletes, what the operator lists), finished ones
# only (schema v3): a task gets its entry once, when it ends, not at each state change.
_FINISHED = tasks.c.state.in_(["succeeded", "discarded", "dead"])
_partial_index("oncely_tasks_finished", tasks.c.state, tasks.c.finished_at, where=_FINISHED)


workers = sa.Table(
    "oncely_workers",
    metadata,
    sa.Column("id", sa.String(200), primary_key=True),
    sa.Column("names", sa.Text(), nullable=False),
    sa.Column("started_at", UTCDateTime(), nullable=False),
    sa.Column("seen_at", UTCDateTime(), nullable=False),
)
"""Live task workers, each with the task names it leases (a JSON list): what `oncely tasks`
reads to say which waiting tasks no live worker can run. A worker writes its row when it
starts and every `ANNOUNCE_EVERY` seconds, and deletes it when it stops; a row not seen for
three periods is a worker that died."""


# -- the control plane (schema v4): what operators did and what each attempt came to -------

_ROW_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

attempts = sa.Table(
    "oncely_attempts",
    metadata,
    sa.Column("id", _ROW_ID, primary_key=True, autoincrement=True),
    sa.Column("job", sa.String(200), nullable=False),
    sa.Column("key", sa.String(200), nullable=True),
    sa.Column("slot", UTCDateTime(), nullable=True),
    sa.Column("slot_last", UTCDateTime(), nullable=True),
    sa.Column("outcome", sa.String(16), nullable=True),
    sa.Column("replica", sa.String(255), nullable=False),
    sa.Column("host", sa.String(255), nullable=True),
    sa.Column("pid", sa.Integer, nullable=True),
    sa.Column("started_at", UTCDateTime(), nullable=True),
    sa.Column("finished_at", UTCDateTime(), nullable=True),
    sa.Column("recorded_at", UTCDateTime(), nullable=False),
    sa.Column("error_class", sa.String(200), nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("cancel_requested_at", UTCDateTime(), nullable=True),
    sa.Column("cancel_requested_by", sa.String(255), nullable=True),
    # Schema v14: the slot's fate, written in the attempt's own transaction while it still
    # held the slot: `final` (given up: no replica starts the slot again until an operator's
    # release), or `retry_at` (the job's retry policy: not before then, database time).
    sa.Column("final", sa.Boolean(), nullable=True),
    sa.Column("retry_at", UTCDateTime(), nullable=True),
    comment="One row per attempt at a slot (and per overlap skip or missed range), written "
    "outside the job's transaction: what `oncely explain` reads.",
)
sa.Index("oncely_attempts_slot", attempts.c.job, attempts.c.key)
sa.Index("oncely_attempts_job_slot", attempts.c.job, attempts.c.slot)
sa.Index("oncely_attempts_recorded_at", attempts.c.recorded_at)
MARKED = sa.or_(attempts.c.final, attempts.c.retry_at.is_not(None))
"""The attempts that decide whether their slot may start again (schema v14): given up, or
failed with a retry time; what an attempt's claim looks up, by (job, key), and counts."""
_partial_index("oncely_attempts_marked", attempts.c.job, attempts.c.key, where=MARKED)

pauses = sa.Table(
    "oncely_pauses",
    metadata,
    sa.Column("id", _ROW_ID, primary_key=True, autoincrement=True),
    sa.Column("job", sa.String(200), nullable=False),
    sa.Column("paused_at", UTCDateTime(), nullable=False),
    sa.Column("paused_by", sa.String(255), nullable=False),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("resumed_at", UTCDateTime(), nullable=True),
    sa.Column("resumed_by", sa.String(255), nullable=True),
    comment="One row per pause of a job; the one without resumed_at is in force.",
)
# At most one pause in force per job.
_partial_index(
    "oncely_pauses_in_force", pauses.c.job, where=pauses.c.resumed_at.is_(None), unique=True
)

audit = sa.Table(
    "oncely_audit",
    metadata,
    sa.Column("id", _ROW_ID, primary_key=True, autoincrement=True),
    sa.Column("at", UTCDateTime(), nullable=False),
    sa.Column("actor", sa.String(255), nullable=False),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("job", sa.String(200), nullable=True),
    sa.Column("target", sa.String(500), nullable=False),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("result", sa.Text, nullable=False),
    comment="One row per operator action, written in the action's own transaction.",
)
sa.Index("oncely_audit_job", audit.c.job, audit.c.id)

task_cancels = sa.Table(
    "oncely_task_cancels",
    metadata,
    sa.Column("task_id", _TASK_ID, primary_key=True, autoincrement=False),
    sa.Column("requested_at", UTCDateTime(), nullable=False),
    sa.Column("requested_by", sa.String(255), nullable=False),
    comment="A request to cancel a running task; its worker reads it on its heartbeat.",
)


# What an operator lists when something went wrong, newest first (`oncely tasks --state dead`):
# dead and discarded tasks only (schema v4). Without it the newest dead tasks are found by
# walking every newer task back from the newest id (100,000 rows: 20 ms and growing); a task
# gets its entry once, if it ends that way.
_FAILED = tasks.c.state.in_(["discarded", "dead"])
_partial_index("oncely_tasks_failed", tasks.c.state, tasks.c.id, where=_FAILED)


# Suppressed duplicate slot attempts (schema v8): one row per attempt that found its slot
# claimed, written after it, outside any job transaction (best effort). What the dashboard
# counts; a table of its own, so that the attempt records that explain and cancel read stay
# as few as the attempts that ran.
duplicates = sa.Table(
    "oncely_duplicates",
    metadata,
    sa.Column("id", _ROW_ID, primary_key=True, autoincrement=True),
    sa.Column("job", sa.String(200), nullable=False),
    sa.Column("key", sa.String(200), nullable=False),
    sa.Column("slot", UTCDateTime(), nullable=True),
    sa.Column("replica", sa.String(255), nullable=False),
    sa.Column("recorded_at", UTCDateTime(), nullable=False),
    comment="One row per suppressed duplicate attempt at a claimed slot (the dashboard's count).",
)
sa.Index("oncely_duplicates_slot", duplicates.c.job, duplicates.c.key)
sa.Index("oncely_duplicates_recorded_at", duplicates.c.recorded_at)


# Every failed attempt's error (schema v11): one row per attempt that was retried, died or
# was discarded, written in the statement batch that records its outcome on the task row
# (whose `error` keeps the last one only). A surrogate key: an operator's retry starts the
# attempts again at 1, and the history before it stays. Read by task, newest first, on
# (task_id, id); deleted with its task by prune.
task_errors = sa.Table(
    "oncely_task_errors",
    metadata,
    sa.Column("id", _ROW_ID, primary_key=True, autoincrement=True),
    sa.Column("task_id", _TASK_ID, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("by", sa.String(255), nullable=True),
    sa.Column("at", UTCDateTime(), nullable=False),
    comment="One row per failed task attempt: its error and traceback, who ran it, when.",
)
sa.Index("oncely_task_errors_task", task_errors.c.task_id, task_errors.c.id)


# The first appearance of each job (schema v16): written (first one wins) when a worker or
# `oncely run` starts with the job. Slots before it were never expected: `oncely verify`
# calls them "before the job existed", never missed.
jobs = sa.Table(
    "oncely_jobs",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("first_seen", UTCDateTime(), nullable=False),
    comment="One row per job a worker or `oncely run` started with: when it first appeared.",
)


# Schedules kept as data (schema v17): one row per schedule that `app.schedules` added at
# runtime. Its slots are claimed in oncely_runs under `schedule:<name>`; `next_slot` is the
# first slot not yet handled, and what the scheduler looks up (by index) to find the due ones.
schedules = sa.Table(
    "oncely_schedules",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("cron", sa.String(200), nullable=True),
    sa.Column("every_seconds", sa.Float, nullable=True),
    sa.Column("tz", sa.String(64), nullable=False, server_default="UTC"),
    sa.Column("target_kind", sa.String(8), nullable=False),
    sa.Column("target", sa.String(200), nullable=False),
    sa.Column("args", sa.Text, nullable=False, server_default="{}"),
    sa.Column("catch_up", sa.String(8), nullable=False),
    sa.Column("grace_seconds", sa.Float, nullable=True),
    sa.Column("overlap", sa.String(8), nullable=False),
    sa.Column("timeout_seconds", sa.Float, nullable=True),
    sa.Column("state", sa.String(8), nullable=False),
    sa.Column("pause_reason", sa.Text, nullable=True),
    sa.Column("next_slot", UTCDateTime(), nullable=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("changed_at", UTCDateTime(), nullable=False),
    sa.Column("changed_by", sa.String(255), nullable=False),
    # The worker attempting the row's due slots, until when (schema 19, Postgres): taken with
    # FOR UPDATE SKIP LOCKED at the due read, so one worker at a time attempts a due row.
    sa.Column("leased_until", UTCDateTime(), nullable=True),
    sa.Column("leased_by", sa.String(255), nullable=True),
    comment="One row per schedule kept as data; its slots are claimed like a code job's.",
)
# The active schedules by their next slot: what the scheduler reads to find the due ones
# (`next_slot <= now`), an index range, never the whole table.
_partial_index("oncely_schedules_due", schedules.c.next_slot, where=schedules.c.state == "active")
