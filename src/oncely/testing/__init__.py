"""oncely.testing: prove that a job, a task or a queue handler takes effect once.

The two tests every job needs — a duplicate delivery has one effect; a crash between the
work and the ack, then the retry, has one effect — as `deliver_twice` and
`crash_between_work_and_ack`, plus `run_replicas` (the incident: N processes, one slot),
a clock to freeze and move, a `FakeProvider` that honours idempotency keys, and assertions
for retry policies. The pytest plugin (`oncely.testing.plugin`, loaded by its entry point)
gives a real database. See docs/testing.md.
"""

from __future__ import annotations

from .clock import FrozenClock
from .database import prepare_database, using_database
from .deliver import (
    CrashResult,
    Deliveries,
    SimulatedCrash,
    crash_between_work_and_ack,
    crash_point,
    deliver_twice,
    run_replicas,
)
from .provider import AppliedEffect, FakeProvider, Faults, ProviderError
from .retry import (
    Decision,
    Kind,
    as_decider,
    assert_discards,
    assert_not_retried,
    assert_retries,
    assert_waits,
    retry_schedule,
)
from .targets import Call, Delivery, JobSlot, Target, register_target_kind
from .task_target import TaskRun

__all__ = [
    "AppliedEffect",
    "Call",
    "CrashResult",
    "Decision",
    "Deliveries",
    "Delivery",
    "FakeProvider",
    "Faults",
    "FrozenClock",
    "JobSlot",
    "Kind",
    "ProviderError",
    "SimulatedCrash",
    "Target",
    "TaskRun",
    "as_decider",
    "assert_discards",
    "assert_not_retried",
    "assert_retries",
    "assert_waits",
    "crash_between_work_and_ack",
    "crash_point",
    "deliver_twice",
    "prepare_database",
    "register_target_kind",
    "retry_schedule",
    "run_replicas",
    "using_database",
]
