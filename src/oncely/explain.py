"""Why did slot T of job J (not) run? One answer from what the database recorded: the claim,
the attempt records, the pauses, the missed and overlap reports. Pure: the app reads the
records and hands them here.

The answers, first match wins: ran (and, if an operator released an earlier run, that
too) · running · not_due · skipped (an operator settled it on purpose) · released (it ran,
or was given up, and an operator freed it: who ran it, who released it, when, why) · the
last attempt's end (failed, timeout, cancelled, or died: its process never recorded an end
and no longer holds the slot; retried by the job's policy, with the attempts left, or given
up after N attempts) · paused · overlap · missed (catch-up policy, grace, busy past the
window) · before_job (no record and no release, and the slot came before the job first
appeared: never expected) · no_worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from .model import (
    OPERATOR_SKIP,
    UNRUNNABLE,
    Attempt,
    Claim,
    Explanation,
    Pause,
    Release,
    TaskRecord,
    TaskState,
)


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
    releases: Sequence[Release] = (),
    budget: int | None = None,
) -> Explanation:
    """The one answer for a slot, with its sentence and fields; `first_seen`: when the job
    first appeared (a slot before it with no record was never expected to run); `releases`:
    the operators' releases of its key; `budget`: the attempts its retry policy allows."""
    attempts = tuple(r for r in records if r.started_at is not None)
    base: dict[str, Any] = {"job": job, "key": key, "slot": slot}
    head = f"{job} slot {_iso(slot)}"
    fields: dict[str, Any] = {
        "attempts": [_attempt_fields(a) for a in attempts],
        "releases": [_release_fields(r) for r in releases],
    }
    failures = [a for a in attempts if a.outcome in _ENDS]
    if claim is not None:
        fields |= {
            "by": claim.claimed_by,
            "at": _iso(claim.claimed_at),
            "duration_ms": None if claim.duration is None else round(claim.duration * 1000, 1),
        }
        after = f", after {len(failures)} attempts that did not" if failures else ""
        again = _again(claim, releases)
        sentence = (
            f"{head} ran: claimed by {claim.claimed_by} at {_iso(claim.claimed_at)}, "
            f"took {_ms(claim.duration)}{after}.{again}"
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
    settled = _settled(base, head, records, ended, releases, fields, attempts)
    if settled is not None:
        return settled
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
        return _ended(base, head, ended, fields, attempts, budget)
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
    if first_seen is not None and slot < first_seen and not records:
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


def _settled(
    base: dict[str, Any],
    head: str,
    records: Sequence[Attempt],
    ended: list[Attempt],
    releases: Sequence[Release],
    fields: dict[str, Any],
    attempts: tuple[Attempt, ...],
) -> Explanation | None:
    """An operator's word on a slot that has no claim: skipped on purpose, or released
    after its last ended attempt (who ran it, who freed it, why); None if neither."""
    job, key, slot = base["job"], base["key"], base["slot"]
    skips = [r for r in records if r.outcome == OPERATOR_SKIP and r.final]
    if skips:
        s = skips[-1]
        fields |= {"by": s.replica, "at": _iso(s.finished_at), "reason": s.error}
        sentence = (
            f"{head} was skipped on purpose by {s.replica} at {_iso(s.finished_at)}: "
            f"{s.error}; no replica starts it (`oncely release {job} {key}` undoes it)."
        )
        return Explanation(
            **base, answer="skipped", sentence=sentence, fields=fields, attempts=attempts
        )
    freed = [r for r in releases if not ended or r.at > (ended[-1].finished_at or slot)]
    if not freed:
        return None
    rel = freed[-1]
    fields |= {"by": rel.actor, "at": _iso(rel.at), "reason": rel.reason}
    sentence = (
        f"{head} was {_released(rel)}: it may run again (a worker's catch-up, `oncely run`, "
        "or `oncely backfill`)."
    )
    return Explanation(
        **base, answer="released", sentence=sentence, fields=fields, attempts=attempts
    )


def _ended(
    base: dict[str, Any],
    head: str,
    ended: list[Attempt],
    fields: dict[str, Any],
    attempts: tuple[Attempt, ...],
    budget: int | None = None,
) -> Explanation:
    last = ended[-1]
    answer = last.outcome or "died"
    n = len(ended)
    tries = f" ({n} attempts)" if n > 1 else ""
    counted = sum(1 for a in ended if a.final or a.retry_at is not None)
    free = _fate(last, counted, budget)
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
        "attempts_counted": counted,
        "attempts_left": None if budget is None or last.final else max(budget - counted, 0),
    }
    return Explanation(**base, answer=answer, sentence=sentence, fields=fields, attempts=attempts)


def _fate(last: Attempt, counted: int, budget: int | None) -> str:
    """What the last ended attempt left its slot as: given up after N attempts (and what
    settles it), retried at T (with the attempts left), or free."""
    if last.final:
        after = f" after {counted} attempt{'s' if counted != 1 else ''}" if counted else ""
        return (
            f"rolled back; given up{after}: no replica starts it again (`oncely release "
            f"{last.job} {last.key}` runs it again, `oncely skip {last.job} {last.key} "
            "--reason TEXT` settles it as skipped on purpose)"
        )
    if last.retry_at is not None:
        left = ""
        if budget is not None:
            n = max(budget - counted, 0)
            left = f" ({n} of {budget} attempt{'s' if budget != 1 else ''} left)"
        return (
            f"rolled back; the job's retry policy runs it again at {_iso(last.retry_at)}"
            f"{left}; `oncely run` retries it now"
        )
    return "rolled back, the slot is free"


def _again(claim: Claim, releases: Sequence[Release]) -> str:
    """' It ran again after it was released …' when an operator released an earlier run."""
    earlier = [r for r in releases if r.at <= claim.claimed_at]
    return f" It ran again after it was {_released(earlier[-1])}." if earlier else ""


def _released(release: Release) -> str:
    """'released (ran at T by R) by X at T2 (reason)'."""
    why = f" ({release.reason})" if release.reason else ""
    return f"{release.result} by {release.actor} at {_iso(release.at)}{why}"


def _release_fields(release: Release) -> dict[str, Any]:
    return {
        "at": _iso(release.at),
        "by": release.actor,
        "reason": release.reason,
        "result": release.result,
    }


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
