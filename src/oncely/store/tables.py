"""oncely's tables, as one SQLAlchemy MetaData that Alembic users can include."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

metadata = sa.MetaData()


class UTCDateTime(TypeDecorator[datetime]):
    """An instant: timestamptz on Postgres; naive-UTC text on SQLite, read back as aware UTC."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("oncely stores only timezone-aware instants")
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
