"""oncely: scheduled and background jobs whose effects happen once.

The public API; everything else is an implementation detail.
"""

from __future__ import annotations

from .app import Oncely
from .effects import Effect, EffectResult, OnceHandler, SyncEffect
from .errors import (
    BadInputError,
    ConfigError,
    DatabaseError,
    DatabaseUnavailableError,
    JobTransactionError,
    OncelyError,
    PayloadError,
    ResultError,
    ResultTimeoutError,
    SchemaMissingError,
    TaskFailedError,
    TaskStateError,
    UnknownJobError,
    UnknownTaskError,
)
from .keys import idempotency_key
from .model import Claim, RunResult, RunStatus, Slot, TaskRecord, TaskState
from .retry import Discard, GiveUp, Retry, RetryPolicy
from .schedule import CronSchedule, EverySchedule, Schedule, cron, every
from .store import claim_run, claim_run_sync
from .tasks import Task

__version__ = "0.1.0"

__all__ = [
    "BadInputError",
    "Claim",
    "ConfigError",
    "CronSchedule",
    "DatabaseError",
    "DatabaseUnavailableError",
    "Discard",
    "Effect",
    "EffectResult",
    "EverySchedule",
    "GiveUp",
    "JobTransactionError",
    "OnceHandler",
    "Oncely",
    "OncelyError",
    "PayloadError",
    "ResultError",
    "ResultTimeoutError",
    "Retry",
    "RetryPolicy",
    "RunResult",
    "RunStatus",
    "Schedule",
    "SchemaMissingError",
    "Slot",
    "SyncEffect",
    "Task",
    "TaskFailedError",
    "TaskRecord",
    "TaskState",
    "TaskStateError",
    "UnknownJobError",
    "UnknownTaskError",
    "__version__",
    "claim_run",
    "claim_run_sync",
    "cron",
    "every",
    "idempotency_key",
]
