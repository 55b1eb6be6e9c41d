"""Every SQL statement oncely runs, and the only code that knows Postgres from SQLite.

This module is the package's face and its only door: the names below are all that the rest
of oncely imports (an import-linter contract, "the store's face is its only door", keeps
every other module of the package private to it). `Store` (store.py) is the database core
(database.py) and its areas: `claims`, `tasks`, `control`, `views`.

Of all this, users see one thing: `app.store`, a handle to pass to oncely's functions
(`enqueue_committed(app.store, ...)`) and a connection in a transaction of its own
(`app.store.transaction()`); the rest of its shape is oncely's own and may change.
"""

from __future__ import annotations

from ..masking import mask_url
from . import borrowed_connection as borrowed
from .claims import claim_run, claim_run_sync
from .control import Action
from .dialect import ClaimAnswer, ClaimRequest
from .dialects import dialect_for
from .driver_handle import asyncpg_connection
from .lost_commit import claim_landed
from .migrations import COMPATIBLE_UP_TO, LATEST
from .schedules import LEDGER_PREFIX
from .schedules import advance as advance_schedule
from .schedules import ledger_name as schedule_ledger_name
from .session import AttemptSession, violation
from .store import Store
from .tables import metadata, runs, schema_versions, task_starts
from .tables import tasks as tasks_table
from .task_connections import TaskPool
from .task_group import GroupMember, TaskGroup
from .task_queue import AttemptGivenUp, Fence, Leased, Settle, TaskQueue, TaskTransaction
from .task_queue import enqueue as enqueue_in
from .task_queue import enqueue_sync as enqueue_in_sync
from .urls import normalize_url, sync_url
from .views import COUNT_CAP, ERRORS_SHOWN, TaskFilter
from .worker_connections import WorkerConnections

__all__ = [
    "COMPATIBLE_UP_TO",
    "COUNT_CAP",
    "ERRORS_SHOWN",
    "LATEST",
    "LEDGER_PREFIX",
    "Action",
    "AttemptGivenUp",
    "AttemptSession",
    "ClaimAnswer",
    "ClaimRequest",
    "Fence",
    "GroupMember",
    "Leased",
    "Settle",
    "Store",
    "TaskFilter",
    "TaskGroup",
    "TaskPool",
    "TaskQueue",
    "TaskTransaction",
    "WorkerConnections",
    "advance_schedule",
    "asyncpg_connection",
    "borrowed",
    "claim_landed",
    "claim_run",
    "claim_run_sync",
    "dialect_for",
    "enqueue_in",
    "enqueue_in_sync",
    "mask_url",
    "metadata",
    "normalize_url",
    "runs",
    "schedule_ledger_name",
    "schema_versions",
    "sync_url",
    "task_starts",
    "tasks_table",
    "violation",
]
