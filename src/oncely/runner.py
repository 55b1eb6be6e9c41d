"""One attempt at one slot: claim → call → commit or rollback, then one outcome → one event.

The job's work and the slot's claim commit in the same transaction, or neither does. A loser
never waits: the lock is a try-lock, and a slot someone else holds comes back `busy` at once.

Each step of an attempt answers with an `Outcome` (or None: go on to the next step), and
`report` turns each outcome into exactly one event. Once-per-key effects (`effects.py`) are
attempts of the same shape: they use the same outcomes, the same commit and the same report.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from . import clock, events
from .errors import JobTransactionError
from .model import Claim, RunResult, RunStatus
from .registry import Job
from .store import ClaimOutcome, ClaimRequest, Store, violation
from .store.outcome import claim_landed


class Stage(enum.Enum):
    """The step of an attempt that decided its outcome."""

    CLAIM = "claim"
    """Not claimed: someone holds the slot, another slot of the job runs, or it ran before."""
    CALL = "call"
    """The job (or the effect's body) raised."""
    TRANSACTION = "transaction"
    """The effect's body ended oncely's transaction (commit, rollback or close)."""
    COMMIT = "commit"
    """The commit of work and claim: it landed (ran), or failed (rolled back)."""
    READ_BACK = "read_back"
    """The connection was lost during the commit; the claim read back says it landed (ran),
    or cannot be read (unknown)."""


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to: its status, the step that decided it, and what goes with it."""

    status: RunStatus
    stage: Stage
    claim: Claim | None = None
    """For a slot that ran before: the claim that was already there."""
    error: BaseException | None = None
    """For `failed`: what the job raised, or why the commit failed."""


RAN = Outcome(RunStatus.RAN, Stage.COMMIT)

_NOT_CLAIMED = {
    ClaimOutcome.BUSY: RunStatus.BUSY,
    ClaimOutcome.OVERLAP: RunStatus.OVERLAP,
    ClaimOutcome.TAKEN: RunStatus.SKIPPED,
}


def not_claimed(status: RunStatus, claim: Claim | None = None) -> Outcome:
    """The outcome of an attempt that did not get its claim."""
    return Outcome(status, Stage.CLAIM, claim=claim)


def after_call(session: Session, error: BaseException | None, who: str) -> Outcome | None:
    """The outcome of a call that raised `error` or ended oncely's transaction on `session`
    (`who` says whose session it was, in the error), or None: the attempt may commit."""
    if error is not None:
        return Outcome(RunStatus.FAILED, Stage.CALL, error=error)
    what = violation(session)
    if what is None:
        return None
    return Outcome(
        RunStatus.FAILED,
        Stage.TRANSACTION,
        error=JobTransactionError(f"{who} called {what}() on {_SESSIONS[who]}"),
    )


_SESSIONS = {"the job": "oncely's session", "the effect's body": "its session"}


async def commit(
    store: Store,
    session: AsyncSession,
    job: str,
    key: str,
    *,
    catch: type[BaseException] = Exception,
) -> Outcome:
    """Commit the attempt's work with its claim: RAN, or FAILED (rolled back) on a `catch`."""
    try:
        await store.finish(session, job, key)
    except catch as exc:
        await store.abandon(session)
        return Outcome(RunStatus.FAILED, Stage.COMMIT, error=exc)
    return RAN


class _Event(TypedDict):
    """The event an outcome is reported as: its name, its message, whether it is timed."""

    event: str
    text: str
    timed: bool


# (what, status, stage) → the event; `what` is "run" for a slot, "effect" for a key.
_EVENTS: dict[tuple[str, RunStatus, Stage], _Event] = {
    ("run", RunStatus.BUSY, Stage.CLAIM): {
        "event": "run.busy",
        "text": "another process is running this slot",
        "timed": False,
    },
    ("run", RunStatus.OVERLAP, Stage.CLAIM): {
        "event": "run.overlap_skipped",
        "text": "another slot of this job is still running; not started (overlap=skip)",
        "timed": False,
    },
    ("run", RunStatus.SKIPPED, Stage.CLAIM): {
        "event": "run.skipped",
        "text": "already ran, skipping",
        "timed": False,
    },
    ("run", RunStatus.FAILED, Stage.CALL): {
        "event": "run.failed",
        "text": "the job raised; rolled back, the slot is free",
        "timed": True,
    },
    ("run", RunStatus.FAILED, Stage.TRANSACTION): {
        "event": "run.failed",
        "text": "the job raised; rolled back, the slot is free",
        "timed": True,
    },
    ("run", RunStatus.FAILED, Stage.COMMIT): {
        "event": "run.failed",
        "text": "the commit failed; rolled back, the slot is free",
        "timed": False,
    },
    ("run", RunStatus.RAN, Stage.COMMIT): {"event": "run.ran", "text": "ran", "timed": True},
    ("run", RunStatus.RAN, Stage.READ_BACK): {
        "event": "run.ran",
        "text": "ran (the connection was lost during COMMIT; the claim is in the ledger)",
        "timed": True,
    },
    ("run", RunStatus.UNKNOWN, Stage.READ_BACK): {
        "event": "run.unknown",
        "text": "the connection was lost during COMMIT and the claim cannot be read back: the "
        "work may or may not have committed",
        "timed": False,
    },
    ("effect", RunStatus.SKIPPED, Stage.CLAIM): {
        "event": "effect.skipped",
        "text": "already processed, skipping",
        "timed": False,
    },
    ("effect", RunStatus.FAILED, Stage.CALL): {
        "event": "effect.failed",
        "text": "the body raised; rolled back, the key is free",
        "timed": False,
    },
    ("effect", RunStatus.FAILED, Stage.TRANSACTION): {
        "event": "effect.failed",
        "text": "the body ended oncely's transaction; rolled back",
        "timed": False,
    },
    ("effect", RunStatus.FAILED, Stage.COMMIT): {
        "event": "effect.failed",
        "text": "the commit failed; rolled back, the key is free",
        "timed": False,
    },
    ("effect", RunStatus.RAN, Stage.COMMIT): {"event": "effect.ran", "text": "ran", "timed": True},
}


def report(what: str, outcome: Outcome, duration: float, fields: Mapping[str, Any]) -> None:
    """The one event of an attempt's outcome (`what`: "run" for a slot, "effect" for a key)."""
    event = _EVENTS[(what, outcome.status, outcome.stage)]
    extra: dict[str, Any] = {}
    if outcome.status is RunStatus.SKIPPED:
        claim = outcome.claim
        extra["claimed_by"] = claim.claimed_by if claim else None
        extra["claimed_at"] = claim.claimed_at.isoformat() if claim else None
    level = logging.INFO
    if outcome.status in (RunStatus.FAILED, RunStatus.UNKNOWN):
        level = logging.ERROR
        extra["error"] = f"{type(outcome.error).__name__}: {outcome.error}"
    if event["timed"]:
        extra["duration_ms"] = round(duration * 1000, 1)
    events.emit(event["event"], event["text"], level=level, **extra, **fields)


# -- a slot -------------------------------------------------------------------------------


async def _claim(store: Store, session: AsyncSession, request: ClaimRequest) -> Outcome | None:
    answer = await store.lock_and_claim(session, request)
    if answer is ClaimOutcome.CLAIMED:
        return None
    claim = None
    if answer is ClaimOutcome.TAKEN:
        claim = await store.claim_in(session, request.job, request.key)
    await store.abandon(session)
    return not_claimed(_NOT_CLAIMED[answer], claim)


async def _call(store: Store, job: Job, session: AsyncSession, slot: datetime) -> Outcome | None:
    error: Exception | None = None
    try:
        if job.is_async:
            await job.func(session, slot)  # type: ignore[misc]
        else:
            await session.run_sync(lambda sync_session: job.func(sync_session, slot))
    except Exception as exc:
        error = exc
    except BaseException:
        await store.abandon(session)
        raise
    # A job that swallowed the JobTransactionError fails all the same.
    outcome = after_call(session.sync_session, error, "the job")
    if outcome is not None:
        await store.abandon(session)
    return outcome


async def _commit(store: Store, session: AsyncSession, request: ClaimRequest) -> Outcome:
    outcome = await commit(store, session, request.job, request.key)
    error = outcome.error
    if error is None or not store.is_unavailable(error):
        return outcome
    # Lost during COMMIT, maybe after it landed: the ledger says which.
    landed = await claim_landed(store, request.job, request.key, request.claimed_by)
    if landed is None:
        return Outcome(RunStatus.UNKNOWN, Stage.READ_BACK, error=error)
    if landed:
        return Outcome(RunStatus.RAN, Stage.READ_BACK)
    return outcome


async def attempt_slot(store: Store, job: Job, slot: datetime, request: ClaimRequest) -> Outcome:
    """Claim → call → commit for one slot, in a session of its own; what it came to.

    A job whose transaction is a framework's (`Job.attempt`) runs the same three steps there.
    """
    if job.attempt is not None:
        framework: Outcome = await job.attempt(store, job, slot, request)
        return framework
    async with store.attempt() as session:
        outcome = await _claim(store, session, request)
        if outcome is None:
            outcome = await _call(store, job, session, slot)
        if outcome is None:
            outcome = await _commit(store, session, request)
        return outcome


async def run_slot(
    store: Store,
    job: Job,
    slot: datetime,
    key: str,
    replica: str,
    *,
    busy_ms: int = 200,
    context: Mapping[str, Any] | None = None,
) -> RunResult:
    """Run one slot of a job once, if nobody has; never raises for the job's own errors.

    `context` adds fields to every event of this attempt (the worker adds `latency_ms`).
    """
    started = time.perf_counter()
    fields: dict[str, Any] = {
        "job": job.name,
        "key": key,
        "slot": slot.isoformat(),
        "replica": replica,
        # Fire latency: how late this attempt started, against the slot's nominal time.
        "latency_ms": round((clock.utcnow() - slot).total_seconds() * 1000, 1),
        **(context or {}),
    }
    request = ClaimRequest(
        job=job.name,
        key=key,
        scheduled_for=slot,
        claimed_by=replica,
        busy_ms=busy_ms,
        exclusive=job.overlap == "skip",
    )
    outcome = await attempt_slot(store, job, slot, request)
    duration = time.perf_counter() - started
    report("run", outcome, duration, fields)
    return RunResult(
        job=job.name,
        key=key,
        slot=slot,
        status=outcome.status,
        duration=duration,
        claim=outcome.claim,
        error=outcome.error,
    )
