"""oncely: scheduled and background jobs whose effects happen once.

The public API; everything else is an implementation detail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The public names, by the module that defines them. They are imported on first use (PEP 562),
# so that `import oncely` (and `oncely --version`, `--help`) does not import SQLAlchemy, the
# drivers and the runner; `from oncely import Oncely` works as before.
_WHERE = {
    "Oncely": "app",
    "Effect": "effects",
    "EffectResult": "effects",
    "OnceHandler": "effects",
    "SyncEffect": "effects",
    "BadInputError": "errors",
    "ConfigError": "errors",
    "DatabaseError": "errors",
    "DatabaseUnavailableError": "errors",
    "JobTransactionError": "errors",
    "OncelyError": "errors",
    "PayloadError": "errors",
    "ResultError": "errors",
    "ResultTimeoutError": "errors",
    "SchemaMissingError": "errors",
    "TaskFailedError": "errors",
    "TaskStateError": "errors",
    "UnknownJobError": "errors",
    "UnknownTaskError": "errors",
    "idempotency_key": "keys",
    "Claim": "model",
    "RunResult": "model",
    "RunStatus": "model",
    "Slot": "model",
    "TaskRecord": "model",
    "TaskState": "model",
    "Discard": "retry",
    "GiveUp": "retry",
    "Retry": "retry",
    "RetryPolicy": "retry",
    "CronSchedule": "schedule",
    "EverySchedule": "schedule",
    "Schedule": "schedule",
    "cron": "schedule",
    "every": "schedule",
    "asyncpg_connection": "store",
    "claim_run": "store",
    "claim_run_sync": "store",
    "Task": "tasks",
}

if TYPE_CHECKING:
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
    from .store import asyncpg_connection, claim_run, claim_run_sync
    from .tasks import Task


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then kept in this module)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


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
    "asyncpg_connection",
    "claim_run",
    "claim_run_sync",
    "cron",
    "every",
    "idempotency_key",
]
