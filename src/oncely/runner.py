"""One attempt at one slot: claim → call → commit or rollback, then one outcome → one event.

The job's work and the slot's claim commit in the same transaction, or neither does. A loser
never waits: the lock is a try-lock, and a slot someone else holds comes back `busy` at once.

Each step of an attempt answers with a `SlotOutcome` (or None: go on to the next step), and
`report` turns each outcome into exactly one event. Once-per-key effects (`effects.py`) are
attempts of the same shape: they use the same outcomes, the same commit and the same report.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from . import clock, events, tracing
from .errors import JobCancelledError, JobTimeoutError, JobTransactionError, OncelyError
from .model import OPERATOR_SKIP, Attempt, Claim, Pause, RunResult, RunStatus
from .registry import Job
from .retry import Retry
from .store import ClaimAnswer, ClaimRequest, Store, claim_landed, violation


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
class SlotOutcome:
    """What a slot attempt came to: its status, the step that decided it, and what goes with it."""

    status: RunStatus
    stage: Stage
    claim: Claim | None = None
    """For a slot that ran before: the claim that was already there."""
    error: BaseException | None = None
    """For `failed`: what the job raised, or why the commit failed (for `timeout` and
    `cancelled`: why the attempt was stopped)."""
    pause: Pause | None = None
    """For `paused`: the pause in force."""
    retry_at: datetime | None = None
    """For a failed attempt the job's retry policy retries: when (database time)."""
    final: bool = False
    """A failed attempt given up: recorded final in its own transaction (see `_record_fate`)."""
    attempts: int | None = None
    """For a failed attempt recorded in its transaction, or a slot found given up: how many
    failed attempts the slot's budget has counted, this one included (fleet-wide)."""

    @property
    def recorded(self) -> bool:
        """Whether the attempt's end row was written in its own transaction."""
        return self.final or self.retry_at is not None


RAN = SlotOutcome(RunStatus.RAN, Stage.COMMIT)

Guard = Callable[[AsyncSession], Awaitable[bool]]
"""A check an attempt makes in its transaction right after its claim (a data schedule's
compare-and-set of its next slot, `schedules.advancing`): False, and the attempt is not
started and its claim rolls back."""

_NOT_CLAIMED = {
    ClaimAnswer.BUSY: RunStatus.BUSY,
    ClaimAnswer.OVERLAP: RunStatus.OVERLAP,
    ClaimAnswer.TAKEN: RunStatus.SKIPPED,
    ClaimAnswer.GIVEN_UP: RunStatus.GIVEN_UP,
    ClaimAnswer.RETRY_WAIT: RunStatus.RETRY_WAIT,
}


def not_claimed(status: RunStatus, claim: Claim | None = None) -> SlotOutcome:
    """The outcome of an attempt that did not get its claim."""
    return SlotOutcome(status, Stage.CLAIM, claim=claim)


def after_call(session: Session, error: BaseException | None, who: str) -> SlotOutcome | None:
    """The outcome of a call that raised `error` or ended oncely's transaction on `session`
    (`who` says whose session it was, in the error), or None: the attempt may commit."""
    if error is not None:
        return SlotOutcome(RunStatus.FAILED, Stage.CALL, error=error)
    what = violation(session)
    if what is None:
        return None
    return SlotOutcome(
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
) -> SlotOutcome:
    """Commit the attempt's work with its claim: RAN, or FAILED (rolled back) on a `catch`."""
    try:
        await store.claims.finish(session, job, key)
    except catch as exc:
        await store.claims.abandon(session)
        return SlotOutcome(RunStatus.FAILED, Stage.COMMIT, error=exc)
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
    ("run", RunStatus.GIVEN_UP, Stage.CLAIM): {
        "event": "run.given_up",
        "text": "the slot was given up (its retry budget is spent, or an operator cancelled "
        "or skipped it): not started (`oncely release` frees it)",
        "timed": False,
    },
    ("run", RunStatus.RETRY_WAIT, Stage.CLAIM): {
        "event": "run.retry_wait",
        "text": "an earlier attempt at this slot failed; the job's retry policy runs it later",
        "timed": False,
    },
    ("run", RunStatus.FAILED, Stage.CALL): {
        "event": "run.failed",
        "text": "the job raised; rolled back, the slot's fate (retry or given up) is recorded",
        "timed": True,
    },
    ("run", RunStatus.FAILED, Stage.TRANSACTION): {
        "event": "run.failed",
        "text": "the job raised; rolled back, the slot's fate (retry or given up) is recorded",
        "timed": True,
    },
    ("run", RunStatus.FAILED, Stage.COMMIT): {
        "event": "run.failed",
        "text": "the commit failed; rolled back, the slot is free",
        "timed": False,
    },
    ("run", RunStatus.TIMEOUT, Stage.CALL): {
        "event": "run.timeout",
        "text": "the job ran past its timeout: cancelled, rolled back, the slot's fate is recorded",
        "timed": True,
    },
    ("run", RunStatus.CANCELLED, Stage.CALL): {
        "event": "run.cancelled",
        "text": "the attempt was cancelled: rolled back",
        "timed": True,
    },
    ("run", RunStatus.PAUSED, Stage.CLAIM): {
        "event": "run.paused",
        "text": "the job is paused: not started",
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


_ERRORS = {
    RunStatus.FAILED: logging.ERROR,
    RunStatus.UNKNOWN: logging.ERROR,
    RunStatus.TIMEOUT: logging.ERROR,
    RunStatus.CANCELLED: logging.WARNING,
}


def report(what: str, outcome: SlotOutcome, duration: float, fields: Mapping[str, Any]) -> None:
    """The one event of an attempt's outcome (`what`: "run" for a slot, "effect" for a key)."""
    event = _EVENTS[(what, outcome.status, outcome.stage)]
    extra: dict[str, Any] = {}
    if outcome.status is RunStatus.SKIPPED:
        claim = outcome.claim
        extra["claimed_by"] = claim.claimed_by if claim else None
        extra["claimed_at"] = claim.claimed_at.isoformat() if claim else None
    level = logging.WARNING if outcome.status is RunStatus.GIVEN_UP else logging.INFO
    if outcome.status in _ERRORS:
        level = _ERRORS[outcome.status]
        extra["error"] = f"{type(outcome.error).__name__}: {outcome.error}"
    if outcome.pause is not None:
        extra["paused_by"] = outcome.pause.paused_by
        extra["paused_at"] = outcome.pause.paused_at.isoformat()
        extra["reason"] = outcome.pause.reason
    if outcome.final:
        extra["given_up"] = True
    if outcome.attempts is not None:
        extra["attempts"] = outcome.attempts
    if outcome.retry_at is not None:
        extra["retry_at"] = outcome.retry_at.isoformat()
    if event["timed"]:
        extra["duration_ms"] = round(duration * 1000, 1)
    events.emit(event["event"], event["text"], level=level, **extra, **fields)


# -- a slot -------------------------------------------------------------------------------


async def _claim(store: Store, session: AsyncSession, request: ClaimRequest) -> SlotOutcome | None:
    answer = await store.claims.lock_and_claim(session, request)
    if answer is ClaimAnswer.CLAIMED:
        return None
    claim = None
    if answer is ClaimAnswer.TAKEN:
        claim = await store.claims.claim_in(session, request.job, request.key)
    await store.claims.abandon(session)
    return not_claimed(_NOT_CLAIMED[answer], claim)


CANCEL_POLL = 1.0
"""Seconds between two looks of a running attempt at its cancel request, while it polls."""
CANCEL_POLL_LISTENING = 4.0
"""The same while the database notifies this process of cancel requests (Postgres LISTEN):
the poll only covers a notification lost with its connection."""
LISTEN_AFTER = 1.0
"""Seconds an attempt runs before it listens for cancel requests (short jobs never open the
listening connection: their first poll comes first)."""


class Watch:
    """What may stop a running attempt early: its job's `timeout`, an operator's cancel."""

    def __init__(self, store: Store, job: Job, record: Record) -> None:
        self.store = store
        self.record = record
        self.timeout = job.timeout.total_seconds() if job.timeout is not None else None
        self.started = time.monotonic()
        self.cancelled_by: str | None = None

    @property
    def attempt_id(self) -> int | None:
        return self.record.id

    def _stop(self) -> SlotOutcome | None:
        if self.cancelled_by is not None:
            error: OncelyError = JobCancelledError(f"cancelled by {self.cancelled_by}")
            return SlotOutcome(RunStatus.CANCELLED, Stage.CALL, error=error)
        if self.timeout is not None and time.monotonic() - self.started >= self.timeout:
            error = JobTimeoutError(f"the job ran longer than its timeout of {self.timeout:g} s")
            return SlotOutcome(RunStatus.TIMEOUT, Stage.CALL, error=error)
        return None

    async def _asked(self) -> None:
        if self.attempt_id is None or self.cancelled_by is not None:
            return
        with contextlib.suppress(OncelyError):  # unreadable now: look again next time
            self.cancelled_by = await self.store.control.cancel_request(self.attempt_id)

    def _wait(self, poll: float | None) -> float | None:
        if self.timeout is None:
            return poll
        left = max(0.0, self.timeout - (time.monotonic() - self.started))
        return left if poll is None else min(poll, left)

    async def until_stopped(self, call: asyncio.Future[Any]) -> SlotOutcome | None:
        """Wait for `call` to end; an outcome if the attempt must stop first (timeout,
        cancel), None once `call` is done."""
        if self.record.id is None:  # not recorded yet: an attempt that is quick needs none
            stop = await self._until(call, None, self.started + LISTEN_AFTER)
            if stop is not None or call.done():
                return stop
            await self.record.start()
        attempt_id = self.record.id
        if attempt_id is None:  # no control plane here (or the record failed): time out only
            return await self._until(call, None, None)
        async with self.store.control.signals.watch(attempt_id) as cancelled:
            return await self._until(call, CANCEL_POLL, None, cancelled)

    async def _until(
        self,
        call: asyncio.Future[Any],
        poll: float | None,
        until: float | None,
        cancelled: asyncio.Event | None = None,
    ) -> SlotOutcome | None:
        """Wait (polling every `poll`, woken by `cancelled`) for `call`, a stop, or `until`."""
        woken = asyncio.ensure_future(cancelled.wait()) if cancelled is not None else None
        try:
            while not call.done():
                if until is not None and time.monotonic() >= until:
                    return None
                listening = woken is not None and self.store.control.signals.listening
                wait = self._wait(CANCEL_POLL_LISTENING if listening else poll)
                if until is not None:
                    left = max(0.0, until - time.monotonic())
                    wait = left if wait is None else min(wait, left)
                pending = {call} | ({woken} if woken else set())
                await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                if call.done():
                    return None
                await self._asked()  # woken by a notification, or the poll's turn
                stop = self._stop()
                if stop is not None:
                    return stop
            return None
        finally:
            if woken is not None:
                woken.cancel()

    async def after_sync(self) -> SlotOutcome | None:
        """For a plain `def` job, which cannot be interrupted: once it returned, whether it
        ran past its timeout or was cancelled meanwhile (then it must not commit)."""
        await self._asked()
        return self._stop()


async def _call(
    store: Store, job: Job, session: AsyncSession, slot: datetime, watch: Watch
) -> SlotOutcome | None:
    error: Exception | None = None
    try:
        if job.is_async:
            stop = await _call_async(job, session, slot, watch)
        else:
            await session.run_sync(lambda sync_session: job.func(sync_session, slot))
            stop = await watch.after_sync()
        if stop is not None:
            return stop
    except Exception as exc:
        error = exc
    except BaseException:
        await store.claims.abandon(session)
        raise
    # A job that swallowed the JobTransactionError fails all the same.
    return after_call(session.sync_session, error, "the job")


async def _record_fate(
    store: Store, job: Job, session: AsyncSession, record: Record, outcome: SlotOutcome
) -> SlotOutcome:
    """A failed, timed-out or cancelled attempt's fate, recorded in its own transaction while
    it still holds the slot (see `Store.give_up`): given up (final), or retried at the time
    the job's `retry=` policy says. Where that cannot be written (an older schema, a dead
    connection) the attempt is rolled back whole: its slot is free, as after a crash."""
    if not record.recordable_in_transaction:
        await store.claims.abandon(session)
        return outcome
    write, decided = fate_writer(job, outcome, record.fate, record.slot)
    try:
        await store.claims.give_up(session, record.request.job, record.request.key, write)
    except Exception:  # rolled back whole: the slot is free, the end recorded outside
        await store.claims.abandon(session)
        return outcome
    return decided(outcome)


Fate = Callable[..., tuple[Any, Any]]
"""`fate(outcome, final=…, retry_at=…)`: the statement of a failed attempt's end row."""


def fate_writer(
    job: Job, outcome: SlotOutcome, fate: Fate, slot: datetime
) -> tuple[Callable[[int, datetime], tuple[Any, Any]], Callable[[SlotOutcome], SlotOutcome]]:
    """For a failed attempt's end written in its own transaction: the `record(tries, now)`
    that `Store.give_up` (or `borrowed.give_up`) calls, which decides given up or retried
    (the job's retry policy, its attempts counted from the slot's recorded ones), and a
    function that marks the outcome with what was decided, once it committed."""
    decided: dict[str, Any] = {}

    def write(tries: int, now: datetime) -> tuple[Any, Any]:
        retry_at = retry_time(job, outcome, tries + 1, now, slot)
        decided["retry_at"] = retry_at
        decided["attempts"] = tries + 1
        return fate(outcome, final=retry_at is None, retry_at=retry_at)

    def marked(out: SlotOutcome) -> SlotOutcome:
        retry_at = decided.get("retry_at")
        attempts = decided.get("attempts")
        return dataclasses.replace(
            out, final=retry_at is None, retry_at=retry_at, attempts=attempts
        )

    return write, marked


def retry_time(
    job: Job, outcome: SlotOutcome, attempt: int, now: datetime, slot: datetime
) -> datetime | None:
    """When the job's retry policy (its own or `SLOT_POLICY`) runs the slot again after
    failed attempt number `attempt` (counted fleet-wide), or None: given up (an operator's
    cancel, attempts spent, an error it does not retry, or a retry later than the job's
    `grace` after the slot's time, which no worker would start)."""
    if outcome.status is RunStatus.CANCELLED or outcome.error is None:
        return None
    decision = job.policy.decide(outcome.error, attempt, now)
    if not isinstance(decision, Retry):
        return None
    if job.grace is not None and decision.at > slot + job.grace:
        return None
    return decision.at


async def _call_async(
    job: Job, session: AsyncSession, slot: datetime, watch: Watch
) -> SlotOutcome | None:
    """Run an async job until it returns or `watch` stops it (the job is then cancelled)."""
    if watch.timeout is None and not watch.record.recordable:
        await job.func(session, slot)  # type: ignore[misc]
        return None
    call = asyncio.ensure_future(job.func(session, slot))  # type: ignore[arg-type]
    try:
        stop = await watch.until_stopped(call)
    except BaseException:
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        raise
    if stop is None:
        call.result()  # the job's own error, if it raised
        return None
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)
    return stop


async def _commit(store: Store, session: AsyncSession, request: ClaimRequest) -> SlotOutcome:
    outcome = await commit(store, session, request.job, request.key)
    error = outcome.error
    if error is None or not store.is_unavailable(error):
        return outcome
    # Lost during COMMIT, maybe after it landed: the ledger says which.
    xid = store.claims.attempt_xact(session)
    landed = await claim_landed(store, request.job, request.key, request.claimed_by, xid)
    if landed is None:
        return SlotOutcome(RunStatus.UNKNOWN, Stage.READ_BACK, error=error)
    if landed:
        return SlotOutcome(RunStatus.RAN, Stage.READ_BACK)
    return outcome


async def attempt_slot(
    store: Store,
    job: Job,
    slot: datetime,
    request: ClaimRequest,
    *,
    check_pause: bool = False,
    guard: Guard | None = None,
) -> SlotOutcome:
    """Claim → call → commit for one slot, in a session of its own; what it came to.

    A job whose transaction is a framework's (`Job.attempt`) runs the same three steps there.
    With `check_pause`, a claimed slot whose time lies inside a pause of the job is rolled back
    before the call (the pause is read in the attempt's transaction: one statement, no
    connection of its own). With `guard`, a claimed slot whose guard says False is rolled back
    before the call too, as `skipped` (something moved it on since it was chosen).
    """
    if job.attempt is not None:  # a framework's transaction (Django's)
        framework: SlotOutcome = await job.attempt(store, job, slot, request)
        return framework
    record = Record(store, request, slot)
    try:
        async with store.claims.attempt() as session:
            outcome = await _claim(store, session, request)
            if outcome is None and check_pause:
                outcome = await _paused(store, session, job, slot)
            if outcome is None and guard is not None and not await guard(session):
                await store.claims.abandon(session)  # the claim rolls back: nothing ran
                outcome = SlotOutcome(RunStatus.SKIPPED, Stage.CLAIM)
            if outcome is None:
                await record.claimed(job)
                outcome = await _call(store, job, session, slot, Watch(store, job, record))
                if outcome is not None:
                    outcome = await _record_fate(store, job, session, record, outcome)
            if outcome is None:
                outcome = await _commit(store, session, request)
    except asyncio.CancelledError:  # the worker's shutdown: rolled back, the slot is free
        stopped = JobCancelledError("the worker shut down before the attempt ended")
        await asyncio.shield(
            record.ended(SlotOutcome(RunStatus.CANCELLED, Stage.CALL, error=stopped))
        )
        raise
    await record.ended(outcome)
    return outcome


async def _paused(
    store: Store, session: AsyncSession, job: Job, slot: datetime
) -> SlotOutcome | None:
    """A pause whose interval holds the slot's time (not merely one in force now)."""
    pause = await store.control.pause_in(session, job.name, slot)
    if pause is None:
        return None
    await store.claims.abandon(session)  # the claim rolls back: the slot stays free
    return SlotOutcome(RunStatus.PAUSED, Stage.CLAIM, pause=pause)


class Record:
    """An attempt's record, written outside its transaction in short ones of its own.

    An attempt that fails, times out or is cancelled is recorded when it ends; a quick one
    that succeeds costs no record: its claim says it all. Where the database takes other
    writes while an attempt's transaction is open (Postgres), the start is also recorded
    once the attempt has run LISTEN_AFTER (a plain `def` job, which blocks the loop: once
    claimed), so that it can be explained ("running", or "died" with its process) and
    cancelled while it runs. SQLite's write lock is the attempt's from its claim to its
    commit: there no start is recorded. A duplicate (its slot was claimed before) leaves a
    row in oncely_duplicates, so that suppressed duplicates can be counted from the database
    (the dashboard). Recording is best effort: a record that cannot be written leaves the attempt
    as it is (explain says less about it).
    """

    def __init__(self, store: Store, request: ClaimRequest, slot: datetime) -> None:
        self.store = store
        self.request = request
        self.slot = slot
        self.id: int | None = None
        self.claimed_at: datetime | None = None

    @property
    def recordable(self) -> bool:
        """Whether this attempt's start can be recorded while it runs (and so cancelled)."""
        return self.store.has_control and self.store.dialect.slot_locks

    def _writable(self) -> bool:
        """A record is written on a connection of its own: never wait for one that the
        attempt itself may be holding (a pool with none to spare), skip the record instead."""
        return self.store.has_spare_connection()

    async def start(self) -> None:
        """Record the attempt's start (once, where the database allows it meanwhile)."""
        if self.id is not None or not self.recordable or not self._writable():
            return
        with contextlib.suppress(OncelyError):
            r = self.request
            self.id = await self.store.control.start_attempt(r.job, r.key, self.slot, r.claimed_by)

    async def claimed(self, job: Job) -> None:
        self.claimed_at = clock.utcnow()
        if not job.is_async:
            await self.start()

    @property
    def recordable_in_transaction(self) -> bool:
        """Whether a failed attempt's end can be written in its own transaction (schema 14)."""
        return self.store.has_slot_fate

    def fate(
        self, outcome: SlotOutcome, *, final: bool, retry_at: datetime | None
    ) -> tuple[Any, Any]:
        """The statement of this attempt's end row, written in its transaction."""
        r = self.request
        ended = {
            "job": r.job,
            "key": r.key,
            "slot": self.slot,
            "replica": r.claimed_by,
            "outcome": outcome.status.value,
            "started_at": self.claimed_at,
            "final": final or None,
            "retry_at": retry_at,
        }
        return self.store.control.fate_record(self.id, ended, outcome.error)

    async def ended(self, outcome: SlotOutcome) -> None:
        status = outcome.status
        r = self.request
        if outcome.recorded:
            return  # written in the attempt's own transaction
        with contextlib.suppress(OncelyError):
            if status is RunStatus.OVERLAP:
                if self.id is not None:
                    await self.store.control.forget_attempt(self.id)
                await self.store.control.note(r.job, r.key, self.slot, "overlap", r.claimed_by)
            elif status in _NOT_RUN:
                if self.id is not None:
                    await self.store.control.forget_attempt(self.id)
                if status is RunStatus.SKIPPED and self._writable():
                    # A suppressed duplicate, as data: what the dashboard counts.
                    await self.store.control.duplicate(r.job, r.key, self.slot, r.claimed_by)
            elif self.id is not None:
                await self.store.control.end_attempt(self.id, status.value, outcome.error)
            elif status is not RunStatus.RAN:
                await self.store.control.ended_attempt(
                    r.job,
                    r.key,
                    self.slot,
                    r.claimed_by,
                    status.value,
                    outcome.error,
                    started_at=self.claimed_at,
                )


_NOT_RUN = (
    RunStatus.BUSY,
    RunStatus.SKIPPED,
    RunStatus.PAUSED,
    RunStatus.GIVEN_UP,
    RunStatus.RETRY_WAIT,
)


def paused(
    job: Job, slot: datetime, key: str, pause: Pause, fields: Mapping[str, Any]
) -> RunResult:
    """The result (and the one event) of a slot not started because its job is paused."""
    outcome = SlotOutcome(RunStatus.PAUSED, Stage.CLAIM, pause=pause)
    report("run", outcome, 0.0, fields)
    return RunResult(
        job=job.name, key=key, slot=slot, status=RunStatus.PAUSED, duration=0.0, pause=pause
    )


async def run_slot(
    store: Store,
    job: Job,
    slot: datetime,
    key: str,
    replica: str,
    *,
    busy_ms: int = 200,
    context: Mapping[str, Any] | None = None,
    check_pause: bool = False,
    guard: Guard | None = None,
    retry_now: bool = False,
) -> RunResult:
    """Run one slot of a job once, if nobody has; never raises for the job's own errors.

    `context` adds fields to every event of this attempt (the worker adds `latency_ms`).
    With `check_pause`, a slot whose time lies inside a pause of the job is not started
    (`paused`): the worker's scheduler decided it from the pauses it read, and this check, in
    the attempt's transaction, catches a pause committed since. With `guard`, see
    `attempt_slot`. With `retry_now` (the caller's retry: `oncely run`), a slot waiting for
    its retry policy runs at once.
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
        check_pause=check_pause,
        retry_now=retry_now,
    )
    with tracing.slot_attempt(job.name, key, slot, replica) as span:
        outcome = await attempt_slot(
            store, job, slot, request, check_pause=check_pause, guard=guard
        )
        skip: Attempt | None = None
        if outcome.status is RunStatus.GIVEN_UP:
            outcome, skip = await _why_given_up(store, outcome, request, slot)
        duration = time.perf_counter() - started
        report("run", outcome, duration, fields)  # its span event, if any, on this span
        failed = (outcome.error or outcome.status.value) if outcome.status in _ERRORS else None
        tracing.finish(span, outcome.status.value, failed)
    claimed_by = None
    if outcome.status is RunStatus.RAN:
        claimed_by = replica
    elif outcome.claim is not None:
        claimed_by = outcome.claim.claimed_by
    return RunResult(
        job=job.name,
        key=key,
        slot=slot,
        status=outcome.status,
        duration=duration,
        claim=outcome.claim,
        error=outcome.error,
        claimed_by=claimed_by,
        pause=outcome.pause,
        retry_at=outcome.retry_at,
        given_up=outcome.final or outcome.status is RunStatus.GIVEN_UP,
        attempts=outcome.attempts,
        skipped_by=skip.replica if skip is not None else None,
        skip_reason=skip.error if skip is not None else None,
    )


async def _why_given_up(
    store: Store, outcome: SlotOutcome, request: ClaimRequest, slot: datetime
) -> tuple[SlotOutcome, Attempt | None]:
    """For a slot found given up: how many failed attempts its budget counted, and the
    operator's skip, if that is what settled it (read after the attempt, the rare path;
    best effort)."""
    try:
        records = await store.control.slot_records(request.job, request.key, slot)
    except OncelyError:
        return outcome, None
    marked = [r for r in records if r.final or r.retry_at is not None]
    skips = [r for r in marked if r.outcome == OPERATOR_SKIP]
    failed = len(marked) - len(skips)
    return dataclasses.replace(outcome, attempts=failed), (skips[-1] if skips else None)
