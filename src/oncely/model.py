"""Frozen values shared by every layer: slots, claims and the outcome of one run."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


class RunStatus(str, enum.Enum):
    """What one attempt at a slot came to."""

    RAN = "ran"
    """The slot was claimed here and the job's work committed with the claim."""
    SKIPPED = "skipped"
    """The slot was already claimed (a duplicate): the job was not called."""
    BUSY = "busy"
    """Another process is running this slot right now: the job was not called."""
    OVERLAP = "overlap"
    """`overlap="skip"`: another slot of this job is running right now; not started."""
    FAILED = "failed"
    """The job raised (or the attempt died): everything rolled back, the slot is free."""
    UNKNOWN = "unknown"
    """The connection was lost during COMMIT and the claim could not be read back: the
    work may or may not have committed (`oncely history JOB` tells; a retry is safe)."""


@dataclass(frozen=True)
class Slot:
    """One nominal fire time of a job and the key that identifies it in the ledger."""

    job: str
    key: str
    at: datetime
    """The nominal fire time, timezone-aware, in the schedule's zone."""


@dataclass(frozen=True)
class Claim:
    """A row of the ledger: who ran which slot of which job, and when."""

    job: str
    key: str
    scheduled_for: datetime | None
    claimed_at: datetime
    claimed_by: str
    finished_at: datetime | None

    @property
    def duration(self) -> float | None:
        """Seconds from the claim to the commit, when known."""
        if self.finished_at is None:
            return None
        return (self.finished_at - self.claimed_at).total_seconds()


@dataclass(frozen=True)
class RunResult:
    """The outcome of one attempt at one slot of one job."""

    job: str
    key: str
    slot: datetime | None
    status: RunStatus
    duration: float
    """Seconds spent in the attempt, including the database round trips."""
    claim: Claim | None = None
    """For `skipped`: the claim that was already there (who ran the slot, and when)."""
    error: BaseException | None = None
    """For `failed`: what the job raised."""


class TaskState(str, enum.Enum):
    """Where a queued task is in its life."""

    AVAILABLE = "available"
    """Waiting to run at `run_at` (a first attempt, or a retry after a rolled-back attempt)."""
    RUNNING = "running"
    """Leased by a worker until `lease_expires_at`; if the worker dies, the lease runs out."""
    SUCCEEDED = "succeeded"
    """Its work committed, in the same transaction as this state."""
    DISCARDED = "discarded"
    """Dropped: an error in `discard_on`, or `oncely tasks discard`."""
    DEAD = "dead"
    """Attempts exhausted (or an error outside `retry_on`); kept for inspection and re-runs."""


@dataclass(frozen=True)
class TaskRecord:
    """One row of the task queue, as `enqueue` returns it and `oncely tasks` shows it."""

    id: int
    task: str
    queue: str
    args: dict[str, object]
    state: TaskState
    attempt: int
    run_at: datetime
    created_at: datetime
    idempotency_key: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    locked_by: str | None = None
    lease_expires_at: datetime | None = None
    error: str | None = None
    """The last attempt's error: `Type: message`, then its traceback."""
    duplicate: bool = False
    """Set by `enqueue`: the idempotency key existed, so this is the existing task."""
    priority: int = 0
    """Higher first: a due task is leased before due tasks of lower priority."""
    result: object = None
    """What the task returned (JSON), stored with its success; None before or without one."""
