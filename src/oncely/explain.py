"""Why did slot T of job J (not) run? One answer from what the database recorded: the claim,
the attempt records, the pauses, the missed and overlap reports. Pure: the app reads the
records and hands them here.

The answers, first match wins: ran · running · not_due · the last attempt's end (released:
it ran but its claim was deleted; failed, timeout, cancelled, or died: its process never
recorded an end and no longer holds the slot) · paused · overlap · missed (catch-up policy,
grace, busy past the window) · before_job (no record, and the slot came before the job
first appeared: never expected) · no_worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from .model import UNRUNNABLE, Attempt, Claim, Explanation, Pause, TaskRecord, TaskState


def _iso(t: datetime | None) -> str | None:
    return t.isoformat(timespec="seconds") if t is not None else None


def _attempt_fields(a: Attempt) -> dict[str, Any]:
    return {
        "outcome": a.outcome or ("running" if a.alive else "died"),
        "by": a.replica,
        "started_at": _iso(a.started_at),
        "finished_at": _iso(a.finished_at),
        "error_class": a.error_class,
        "error": a.error,
        "cancelled_by": a.cancel_requested_by,
        "given_up": a.final,
        "retry_at": _iso(a.retry_at),
    }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def span(delta: timedelta) -> str:
    """A length of time as a person reads it: 45s, 12m, 3h, 2d."""
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


_ENDS = {"failed", "timeout", "cancelled"}
_MISSED = {
    "catch_up": "dropped by the job's catch-up policy (catch_up={policy}): a later slot ran "
    "instead",
    "grace": "dropped: it was later than the job's grace period when a worker got to it",
    "busy": "dropped: someone held it until it was older than the job's catch-up window",
}


def explain_slot(
    *,
    job: str,
    key: str,
    slot: datetime,
    now: datetime,
    catch_up: str,
    claim: Claim | None,
    records: Sequence[Attempt],
    pauses: Sequence[Pause],
    first_seen: datetime | None = None,
) -> Explanation:
    """The one answer for a slot, with its sentence and fields; `first_seen`: when the job
    first appeared (a slot before it with no record was never expected to run)."""
    attempts = tuple(r for r in records if r.started_at is not None)
    base: dict[str, Any] = {"job": job, "key": key, "slot": slot}
    head = f"{job} slot {_iso(slot)}"
    fields: dict[str, Any] = {"attempts": [_attempt_fields(a) for a in attempts]}
    failures = [a for a in attempts if a.outcome in _ENDS]
    if claim is not None:
        fields |= {
            "by": claim.claimed_by,
            "at": _iso(claim.claimed_at),
            "duration_ms": None if claim.duration is None else round(claim.duration * 1000, 1),
        }
        after = f", after {len(failures)} attempts that did not" if failures else ""
        sentence = (
            f"{head} ran: claimed by {claim.claimed_by} at {_iso(claim.claimed_at)}, "
            f"took {_ms(claim.duration)}{after}."
        )
        return Explanation(
            **base, answer="ran", sentence=sentence, fields=fields, attempts=attempts
        )
    running = [a for a in attempts if a.outcome is None and a.alive]
    if running:
        a = running[-1]
        fields |= {"by": a.replica, "since": _iso(a.started_at)}
        sentence = f"{head} is running now: {a.replica} started it at {_iso(a.started_at)}."
        return Explanation(
            **base, answer="running", sentence=sentence, fields=fields, attempts=attempts
        )
    if slot > now:
        fields |= {"due_in_s": round((slot - now).total_seconds(), 1)}
        sentence = f"{head} is not due yet: it comes due in {span(slot - now)}."
        return Explanation(
            **base, answer="not_due", sentence=sentence, fields=fields, attempts=attempts
        )
    ended = [
        a
        for a in attempts
        if a.outcome in _ENDS or a.outcome == "ran" or (a.outcome is None and not a.alive)
    ]
    if ended and ended[-1].outcome == "ran":
        a = ended[-1]
        fields |= {"by": a.replica, "at": _iso(a.started_at)}
        sentence = (
            f"{head} ran (by {a.replica} at {_iso(a.started_at)}), but its claim is gone: it "
            "was released by hand or pruned, so the slot can run again."
        )
        return Explanation(
            **base, answer="released", sentence=sentence, fields=fields, attempts=attempts
        )
    if ended:
        return _ended(base, head, ended, fields, attempts)
    for p in reversed(pauses):
        if p.paused_at <= slot and (p.resumed_at is None or slot < p.resumed_at):
            fields |= {
                "since": _iso(p.paused_at),
                "by": p.paused_by,
                "reason": p.reason,
                "resumed_at": _iso(p.resumed_at),
            }
            why = f": {p.reason}" if p.reason else ""
            until = f" until {_iso(p.resumed_at)}" if p.resumed_at else " (still paused)"
            sentence = (
                f"{head} did not run: the job was paused by {p.paused_by} at "
                f"{_iso(p.paused_at)}{until}{why}; `oncely backfill` can run it."
            )
            return Explanation(
                **base, answer="paused", sentence=sentence, fields=fields, attempts=attempts
            )
    overlaps = [r for r in records if r.outcome == "overlap"]
    if overlaps:
        fields |= {"by": overlaps[-1].replica, "at": _iso(overlaps[-1].recorded_at)}
        sentence = (
            f"{head} was skipped for overlap: the job's previous slot was still running when "
            f"it came due (overlap=skip, reported by {overlaps[-1].replica})."
        )
        return Explanation(
            **base, answer="overlap", sentence=sentence, fields=fields, attempts=attempts
        )
    missed = [r for r in records if r.outcome == "missed"]
    if missed:
        m = missed[-1]
        reason = m.error or "catch_up"
        fields |= {
            "reason": reason,
            "by": m.replica,
            "at": _iso(m.recorded_at),
            "first": _iso(m.slot),
            "last": _iso(m.slot_last),
        }
        text = _MISSED.get(reason, "dropped by the worker ({reason})").format(
            policy=catch_up, reason=reason
        )
        sentence = f"{head} was {text} (reported by {m.replica} at {_iso(m.recorded_at)})."
        return Explanation(
            **base, answer="missed", sentence=sentence, fields=fields, attempts=attempts
        )
    if first_seen is not None and slot < first_seen:
        fields |= {"first_seen": _iso(first_seen)}
        sentence = (
            f"{head} came before the job first appeared (at {_iso(first_seen)}): it was never "
            "expected to run."
        )
        return Explanation(
            **base, answer="before_job", sentence=sentence, fields=fields, attempts=attempts
        )
    sentence = (
        f"{head} did not run and no attempt was recorded: no worker was alive when it came "
        "due (or none runs this job, or its records were pruned)."
    )
    return Explanation(
        **base, answer="no_worker", sentence=sentence, fields=fields, attempts=attempts
    )


def _ended(
    base: dict[str, Any],
    head: str,
    ended: list[Attempt],
    fields: dict[str, Any],
    attempts: tuple[Attempt, ...],
) -> Explanation:
    last = ended[-1]
    answer = last.outcome or "died"
    n = len(ended)
    tries = f" ({n} attempts)" if n > 1 else ""
    free = _fate(last)
    if answer == "failed":
        sentence = (
            f"{head} failed{tries}: the last attempt, by {last.replica} at "
            f"{_iso(last.started_at)}, raised {last.error_class}: {last.error}; {free}."
        )
    elif answer == "timeout":
        sentence = (
            f"{head} timed out{tries}: the attempt by {last.replica} at "
            f"{_iso(last.started_at)} ran past the job's timeout and was cancelled; {free}."
        )
    elif answer == "cancelled":
        by = f"by {last.cancel_requested_by}" if last.cancel_requested_by else f"({last.error})"
        sentence = (
            f"{head} was cancelled{tries}: the attempt by {last.replica} at "
            f"{_iso(last.started_at)} was stopped {by}; {free}."
        )
    else:
        sentence = (
            f"{head} did not finish{tries}: the attempt by {last.replica} started at "
            f"{_iso(last.started_at)} never recorded an end and no longer holds the slot (its "
            f"process died: killed, or lost its host); {free}."
        )
    fields |= {
        "by": last.replica,
        "at": _iso(last.started_at),
        "given_up": last.final,
        "retry_at": _iso(last.retry_at),
    }
    return Explanation(**base, answer=answer, sentence=sentence, fields=fields, attempts=attempts)


def _fate(last: Attempt) -> str:
    """What the last ended attempt left its slot as."""
    if last.final:
        return (
            f"rolled back; given up: no replica starts it again (`oncely release {last.job} "
            f"{last.key}` frees it)"
        )
    if last.retry_at is not None:
        return f"rolled back; the job's retry policy runs it again at {_iso(last.retry_at)}"
    return "rolled back, the slot is free"


def explain_task(rec: TaskRecord, cancel: tuple[datetime, str] | None) -> tuple[str, str]:
    """(answer, sentence) for one task, from its row and its cancel request."""
    head = f"task {rec.id} ({rec.task})"
    error = (rec.error or "").split("\n", 1)[0]
    attempts = f"{rec.attempt} attempt{'s' if rec.attempt != 1 else ''}"
    if rec.state is TaskState.SUCCEEDED:
        return "succeeded", f"{head} succeeded at {_iso(rec.finished_at)} after {attempts}."
    if rec.state is TaskState.RUNNING and rec.started_at is None:
        return "leased", (
            f"{head} is leased by {rec.locked_by} and waits for room in that worker; its lease "
            f"runs to {_iso(rec.lease_expires_at)} (attempt {rec.attempt + 1} counts when it "
            "starts)."
        )
    if rec.state is TaskState.RUNNING:
        asked = ""
        if cancel is not None:
            asked = f"; a cancel was requested by {cancel[1]} at {_iso(cancel[0])}"
        return "running", (
            f"{head} is running: {rec.locked_by} started attempt {rec.attempt} at "
            f"{_iso(rec.started_at)}, its lease runs to {_iso(rec.lease_expires_at)}{asked}."
        )
    if rec.state is TaskState.AVAILABLE:
        if error.startswith(UNRUNNABLE):
            return "unrunnable", (
                f"{head} is {error[len(UNRUNNABLE) :]}; due again at {_iso(rec.run_at)}, "
                f"after {attempts}."
            )
        if rec.attempt == 0:
            return "waiting", f"{head} has not started yet: it is due at {_iso(rec.run_at)}."
        return "retrying", (
            f"{head} waits for attempt {rec.attempt + 1} at {_iso(rec.run_at)}; the last one "
            f"failed: {error}."
        )
    if rec.state is TaskState.DEAD:
        return "dead", (
            f"{head} is dead after {attempts}: {error}; `oncely tasks retry {rec.id}` runs it "
            "again."
        )
    return "discarded", f"{head} was discarded at {_iso(rec.finished_at)}: {error}."
