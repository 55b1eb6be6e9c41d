"""Frozen values shared by every layer: slots, claims and the outcome of one run."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


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
    """The job raised: its work rolled back; the job's retry policy (its `retry=`, or
    5 attempts from 3 s) retries the slot (`retry_at`) or, its budget spent, gives it up
    (recorded as final). A commit that failed frees the slot."""
    UNKNOWN = "unknown"
    """The connection was lost during COMMIT and the claim could not be read back: the
    work may or may not have committed (`oncely history JOB` tells; a retry is safe)."""
    TIMEOUT = "timeout"
    """The job ran longer than its `timeout=`: cancelled, rolled back, given up as `failed` is."""
    CANCELLED = "cancelled"
    """An operator cancelled the attempt (`oncely cancel`): rolled back, given up (always
    final); a worker's own shutdown also ends an attempt as cancelled, and frees its slot."""
    PAUSED = "paused"
    """The job is paused (`oncely pause`): not started."""
    GIVEN_UP = "given_up"
    """The slot was given up (its retry budget spent, past its grace, cancelled) or skipped
    on purpose by an operator (its record is final): not started; `oncely release` frees
    it."""
    RETRY_WAIT = "retry_wait"
    """An earlier attempt failed and the job's `retry=` policy runs the slot again later: not
    started yet."""


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
    """For `failed`: what the job raised (for `timeout`, `cancelled`: why it stopped)."""
    claimed_by: str | None = None
    """For `ran`: this attempt's replica; for `skipped`: the replica that ran the slot."""
    pause: Pause | None = None
    """For `paused`: the pause in force."""
    retry_at: datetime | None = None
    """For `failed` or `timeout` under the job's `retry=` policy: when the slot may run again
    (database time)."""
    given_up: bool = False
    """For `failed`, `timeout`, `cancelled`: the attempt recorded the slot as given up (no
    replica starts it again until `oncely release`); False with no `retry_at`: its slot is
    free (its fate could not be recorded, or the worker shut down)."""
    attempts: int | None = None
    """For a failed attempt and for `given_up`: how many failed attempts the slot's retry
    budget has counted, across the fleet (this one included)."""
    skipped_by: str | None = None
    """For `given_up`: the operator who settled the slot as skipped on purpose
    (`oncely skip`), if that is why it is not started; `skip_reason` says why."""
    skip_reason: str | None = None

    @property
    def done(self) -> bool:
        """Whether the slot's work is accounted for: it ran (here or before), or an operator
        skipped it on purpose. False for a failure, a given-up slot, busy, paused and the
        rest: an external scheduler must see that the work did not happen."""
        if self.status in (RunStatus.RAN, RunStatus.SKIPPED):
            return True
        return self.status is RunStatus.GIVEN_UP and self.skipped_by is not None


UNRUNNABLE = "Unrunnable: "
"""How the error of an available task starts when a worker handed it back, uncounted, because
it could not run it (an unknown name, or arguments its function does not take: another
release enqueued it); the rest says what a worker that can must accept and who could not."""


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


@dataclass(frozen=True)
class TaskError:
    """One failed attempt of a task, as its history keeps it (schema 11): the attempt's
    number (counted again from 1 after an operator's retry), its error and traceback as the
    task row kept it, the worker that ran it and when its failure was recorded."""

    attempt: int
    error: str | None
    by: str | None
    at: datetime


@dataclass(frozen=True)
class TaskHistory:
    """The newest recorded failed attempts of a task, newest first: `kept` False on a
    database older than schema 11 (no history there); `more` when older ones exist."""

    errors: list[TaskError]
    kept: bool = True
    more: bool = False


@dataclass(frozen=True)
class Pause:
    """A pause of a job: who asked, when and why; in force while `resumed_at` is None."""

    job: str
    paused_at: datetime
    paused_by: str
    reason: str | None
    resumed_at: datetime | None = None
    resumed_by: str | None = None


@dataclass(frozen=True)
class AuditEntry:
    """One operator action, as the audit trail keeps it."""

    id: int
    at: datetime
    """Database time of the action's transaction."""
    actor: str
    action: str
    job: str | None
    target: str
    reason: str | None
    result: str


@dataclass(frozen=True)
class Attempt:
    """What one attempt at a slot came to, recorded outside the job's transaction.

    `outcome` is None while it runs (or if its process died); `overlap` and `missed` rows
    record slots a worker did not start (`slot_last`: the end of a missed range).
    """

    id: int
    job: str
    key: str | None
    slot: datetime | None
    outcome: str | None
    replica: str
    started_at: datetime | None
    finished_at: datetime | None
    recorded_at: datetime
    error_class: str | None = None
    error: str | None = None
    slot_last: datetime | None = None
    cancel_requested_at: datetime | None = None
    cancel_requested_by: str | None = None
    alive: bool = False
    """For an attempt with no outcome: whether its holder is still running it."""
    final: bool = False
    """It failed, timed out or was cancelled and gave its slot up: no replica starts the slot
    again until `oncely release` (which clears this)."""
    retry_at: datetime | None = None
    """It failed and the job's retry policy runs the slot again at this time."""


@dataclass(frozen=True)
class Release:
    """An operator's release of one slot, from its audit row: when, by whom, why, and what
    it freed (`result`: "released (ran at T by R)" or "released (given up)")."""

    at: datetime
    key: str
    actor: str
    reason: str | None
    result: str


@dataclass(frozen=True)
class Renamed:
    """What `rename OLD NEW` carried to the new name, in one transaction: how many claims,
    attempt records (given-up, skipped-on-purpose, retry and missed marks among them),
    pauses (open and closed) and audit rows (its releases among them)."""

    claims: int
    records: int
    pauses: int
    audit: int

    def summary(self) -> str:
        """The counts in words, as the audit row and the CLI say them."""
        return (
            f"moved {self.claims} claims, {self.records} attempt records, "
            f"{self.pauses} pauses, {self.audit} audit rows"
        )


OPERATOR_SKIP = "operator_skip"
"""The outcome of the note an operator's `oncely skip` writes: the slot is skipped on purpose
(final, with the operator as its replica and the reason as its text)."""


@dataclass(frozen=True)
class PlannedSlot:
    """One slot of a backfill's plan: what `--apply` would do with it, and why."""

    job: str
    key: str
    slot: datetime
    action: str
    """`would run`, `already ran` (see `claim`), `running now` (see `running`), `given up`
    (an attempt failed, timed out or was cancelled: an operator's release frees it) or `not
    due` (later than the database's clock: a backfill refuses it unless told to run it
    early)."""
    claim: Claim | None = None
    running: Attempt | None = None


@dataclass(frozen=True)
class Explanation:
    """Why a slot of a job did (or did not) run, from what the database recorded."""

    job: str
    key: str
    slot: datetime
    answer: str
    """ran · running · not_due · released · failed · timeout · cancelled · died · paused ·
    overlap · missed · before_job · no_worker"""
    sentence: str
    fields: dict[str, Any] = field(default_factory=dict)
    attempts: tuple[Attempt, ...] = ()


@dataclass(frozen=True)
class ScheduleRecord:
    """A schedule kept as a row (`app.schedules`): when it fires, what it runs, and its state.

    Its slots are claimed in the ledger under `ledger_name` (`schedule:<name>`), as a code
    job's are under the job's name."""

    name: str
    cron: str | None
    every: float | None
    """Seconds between slots (aligned to the Unix epoch), when it is not a cron schedule."""
    tz: str
    target_kind: str
    """`task` (enqueued in the slot's transaction) or `job` (called in it)."""
    target: str
    args: dict[str, Any]
    catch_up: str
    grace: float | None
    """Seconds after its time a slot is still started; None: no limit."""
    overlap: str
    timeout: float | None
    """Seconds an attempt may run before it is cancelled; None: no limit."""
    state: str
    """`active` or `paused`."""
    pause_reason: str | None
    version: int
    created_at: datetime
    changed_at: datetime
    changed_by: str
    next_slot: datetime | None
    """The first slot not yet handled (UTC): the scheduler starts it once it is due."""
    ledger_name: str

    @property
    def expression(self) -> str:
        """The cron expression, or the interval as `every 15m`."""
        if self.cron is not None:
            return self.cron
        return f"every {duration_text(self.every or 0)}"


def duration_text(seconds: float) -> str:
    """Seconds as the CLI writes a duration: 1h, 15m, 90s (the largest exact unit)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
