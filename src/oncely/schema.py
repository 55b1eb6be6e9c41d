"""oncely's tables for Alembic: `target_metadata = [app_metadata, oncely.schema.metadata]`.

On Postgres, `oncely migrate` also creates the `oncely_tasks_notify` trigger (the queue's
LISTEN/NOTIFY wake-up); a schema made by Alembic alone works without it, by polling.
"""

from __future__ import annotations

from .store import COMPATIBLE_UP_TO, metadata, runs, schema_versions, task_starts
from .store import LATEST as SCHEMA_VERSION
from .store import tasks_table as tasks

__all__ = [
    "COMPATIBLE_UP_TO",
    "SCHEMA_VERSION",
    "metadata",
    "runs",
    "schema_versions",
    "task_starts",
    "tasks",
]
