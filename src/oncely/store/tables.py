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
    comment="One row per queued task; its state changes commit with the task's own work.",
)


def _partial_index(name: str, *columns: Any, where: Any, unique: bool = False) -> sa.Index:
    """An index of the rows `where` holds for, the same on Postgres and SQLite."""
    return sa.Index(name, *columns, unique=unique, postgresql_where=where, sqlite_where=where)


# An idempotency key is unique per task among all retained rows, whatever their state. Tasks
# without a key have no entry (schema v3): most tasks add nothing here when enqueued, leased
# or acked. Conflict targets name the predicate (`tasks_sql.KEYED`) to infer this index.
_KEYED = tasks.c.idempotency_key.is_not(None)
_partial_index("oncely_tasks_key", tasks.c.task, tasks.c.idempotency_key, where=_KEYED, unique=True)
# What a worker fetches: due, available tasks (of its queues), oldest first.
_AVAILABLE = tasks.c.state == "available"
_partial_index("oncely_tasks_due", tasks.c.run_at, tasks.c.id, where=_AVAILABLE)
_partial_index(
    "oncely_tasks_due_by_queue", tasks.c.queue, tasks.c.run_at, tasks.c.id, where=_AVAILABLE
)
# What the rescuer looks at: leases that may have run out.
_partial_index("oncely_tasks_leases", tasks.c.lease_expires_at, where=tasks.c.state == "running")
# Finished tasks by state and end (what prune deletes, what the operator lists), finished ones
# only (schema v3): a task gets its entry once, when it ends, not at each state change.
_FINISHED = tasks.c.state.in_(["succeeded", "discarded", "dead"])
_partial_index("oncely_tasks_finished", tasks.c.state, tasks.c.finished_at, where=_FINISHED)
# What an operator lists when something went wrong, newest first (`oncely tasks --state dead`):
# dead and discarded tasks only (schema v4). Without it the newest dead tasks are found by
# walking every newer task back from the newest id (100,000 rows: 20 ms and growing); a task
# gets its entry once, if it ends that way.
_FAILED = tasks.c.state.in_(["discarded", "dead"])
_partial_index("oncely_tasks_failed", tasks.c.state, tasks.c.id, where=_FAILED)
