"""How the CLI shows things: every line and table it prints is formatted here, and
printed by `echo` (text) or `dumps` (JSON), the one masking pass: no credential in an error
text, a URL or a libpq DSN reaches the terminal in clear.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from ..masking import mask_secrets
from ..model import (
    Attempt,
    AuditEntry,
    Claim,
    Explanation,
    Pause,
    PlannedSlot,
    RunResult,
    RunStatus,
    TaskHistory,
    TaskRecord,
    TaskState,
)

if TYPE_CHECKING:  # imported for their types only: `oncely --help` imports none of them
    from ..registry import Job
    from ..retry import RetryPolicy
    from ..tasks import Task
    from ..waiting import Waited


def iso(t: datetime | None) -> str:
    """A time as ISO-8601 with its UTC offset, to the second; '-' for none."""
    return t.isoformat(timespec="seconds") if t is not None else "-"


def ms(seconds: float | None) -> str:
    """A duration in milliseconds, e.g. '41 ms'."""
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def run_line(result: RunResult) -> str:
    """The one line `oncely run` prints; its first word is the status."""
    head = f"{result.status.value} {result.job} slot {iso(result.slot)} key {result.key}"
    if result.status is RunStatus.RAN:
        return f"{head} in {ms(result.duration)}"
    if result.status is RunStatus.SKIPPED:
        by = (
            f" (claimed by {result.claim.claimed_by} at {iso(result.claim.claimed_at)})"
            if result.claim
            else ""
        )
        return f"{head}: already ran{by}"
    if result.status is RunStatus.BUSY:
        return f"{head}: another process is running this slot"
    if result.status is RunStatus.OVERLAP:
        return f"{head}: another slot of this job is still running (overlap=skip)"
    if result.status is RunStatus.PAUSED:
        return paused_line(result)
    error = result.error
    if result.status is RunStatus.UNKNOWN:
        return (
            f"{head}: the connection was lost during COMMIT ({type(error).__name__}: {error}) "
            f"and the claim could not be read back: it may or may not have committed; see "
            f"`oncely history {result.job}` (running it again is safe: a landed claim skips)"
        )
    if result.status is RunStatus.GIVEN_UP:
        if result.skipped_by is not None:
            why = f": {result.skip_reason}" if result.skip_reason else ""
            return (
                f"skipped_on_purpose {result.job} slot {iso(result.slot)} key {result.key}: "
                f"skipped on purpose by {result.skipped_by}{why}; not started"
            )
        return f"{head}: {given_up(result)}; not started ({settle(result)})"
    if result.status is RunStatus.RETRY_WAIT:
        return f"{head}: an earlier attempt failed; the job's retry policy runs it later"
    return f"{head}: {type(error).__name__}: {error}; rolled back; {fate(result)}"


def given_up(result: RunResult) -> str:
    """'given up after N attempts' (N: the failed attempts its budget counted)."""
    n = result.attempts
    if not n:
        return "given up (an attempt failed, timed out or was cancelled)"
    return f"given up after {n} attempt{'s' if n != 1 else ''}"


def settle(result: RunResult) -> str:
    """The two commands an operator settles a given-up slot with."""
    return (
        f"`oncely release {result.job} {result.key}` runs it again; `oncely skip {result.job} "
        f"{result.key} --reason TEXT` settles it as skipped on purpose"
    )


def fate(result: RunResult) -> str:
    """What a failed attempt left its slot as: retried later, given up, or free."""
    if result.retry_at is not None:
        n = result.attempts
        tried = f" (attempt {n} failed)" if n else ""
        return (
            f"the job's retry policy retries it at {iso(result.retry_at)}{tried}; "
            f"`oncely run` again retries it now"
        )
    if result.given_up:
        return f"{given_up(result)} ({settle(result)})"
    return "the slot is free"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain left-aligned table with a header row."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def claim_dict(claim: Claim, job: Job | None = None) -> dict[str, Any]:
    """A claim as JSON-ready data (its slot in the job's zone when the job is known)."""
    slot = claim.scheduled_for
    if slot is not None and job is not None:
        slot = slot.astimezone(job.schedule.zone)
    return {
        "job": claim.job,
        "key": claim.key,
        "slot": iso(slot) if slot else None,
        "claimed_by": claim.claimed_by,
        "claimed_at": claim.claimed_at.isoformat(),
        "finished_at": claim.finished_at.isoformat() if claim.finished_at else None,
        "duration_ms": None if claim.duration is None else round(claim.duration * 1000, 1),
    }


def history_rows(claims: Sequence[Claim], jobs: Mapping[str, Job]) -> list[list[str]]:
    """`oncely history` rows: job, key, slot (in its job's zone), by, at, duration."""
    rows = []
    for c in claims:
        slot = c.scheduled_for
        job = jobs.get(c.job)
        if slot is not None and job is not None:
            slot = slot.astimezone(job.schedule.zone)
        rows.append([c.job, c.key, iso(slot), c.claimed_by, iso(c.claimed_at), ms(c.duration)])
    return rows


def echo(text: str = "", *, err: bool = False) -> None:
    """Print one text (stdout, or stderr with `err`), credentials masked."""
    click.echo(mask_secrets(text), err=err)


def masked(data: Any) -> Any:
    """JSON-ready data with every string in it (keys too) credentials-masked."""
    if isinstance(data, str):
        return mask_secrets(data)
    if isinstance(data, dict):
        return {masked(k): masked(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [masked(v) for v in data]
    return data


def dumps(data: Any) -> str:
    """One JSON document, every string in it credentials-masked."""
    return json.dumps(masked(data), indent=2, ensure_ascii=False)


def job_dict(
    job: Job, upcoming: Sequence[datetime], last: Claim | None, pause: Pause | None = None
) -> dict[str, Any]:
    """A job for `oncely list --json`."""
    return {
        "kind": "job",
        "name": job.name,
        "schedule": job.schedule.describe(),
        "zone": str(job.schedule.zone),
        "next": iso(upcoming[0]) if upcoming else None,
        "last_run": claim_dict(last, job) if last else None,
        "paused": pause_dict(pause) if pause is not None else None,
    }


def job_row(
    job: Job, upcoming: Sequence[datetime], last: Claim | None, pause: Pause | None = None
) -> list[str]:
    """A row of `oncely list`: the times in the job's own zone."""
    if last is None:
        last_run = "never"
    else:
        slot = last.scheduled_for
        when = iso(slot.astimezone(job.schedule.zone)) if slot else last.key
        last_run = f"{when} by {last.claimed_by}"
    return [
        job.name,
        job.schedule.describe(),
        str(job.schedule.zone),
        iso(upcoming[0]) if upcoming else "-",
        last_run,
        f"paused {pause_text(pause)}" if pause is not None else "active",
    ]


def task_dict(rec: TaskRecord) -> dict[str, Any]:
    """A task for `oncely tasks --json` and `oncely enqueue`."""
    return {
        "id": rec.id,
        "task": rec.task,
        "queue": rec.queue,
        "state": rec.state.value,
        "attempt": rec.attempt,
        "args": rec.args,
        "idempotency_key": rec.idempotency_key,
        "run_at": rec.run_at.isoformat(),
        "created_at": rec.created_at.isoformat(),
        "started_at": rec.started_at.isoformat() if rec.started_at else None,
        "finished_at": rec.finished_at.isoformat() if rec.finished_at else None,
        "locked_by": rec.locked_by,
        "lease_expires_at": rec.lease_expires_at.isoformat() if rec.lease_expires_at else None,
        # A task that succeeded after failing keeps its earlier attempt's error, not as its own.
        "error": None if rec.state is TaskState.SUCCEEDED else rec.error,
        "earlier_error": rec.error if rec.state is TaskState.SUCCEEDED else None,
        "priority": rec.priority,
        "result": rec.result,
    }


def task_detail(rec: TaskRecord) -> str:
    """`oncely tasks show ID`: one task, a field per line, its result and last error last."""
    fields = task_dict(rec)
    error = fields.pop("error") or fields.pop("earlier_error")
    fields.pop("earlier_error", None)
    result = fields.pop("result")
    fields["args"] = _compact(rec.args)
    lines = [f"{name}: {'-' if value is None else value}" for name, value in fields.items()]
    if rec.state is TaskState.SUCCEEDED:
        lines.append(f"result: {_compact(result)}")
    if error:
        lines.append("error:" if rec.state is not TaskState.SUCCEEDED else "earlier error:")
        lines += ["  " + line for line in error.rstrip().split("\n")]
    return "\n".join(lines)


def history_list(history: TaskHistory) -> list[dict[str, Any]] | None:
    """A task's failed attempts for `oncely tasks show --json`, newest first, credentials
    masked (None: the database keeps none, schema older than 11)."""
    if not history.kept:
        return None
    return [
        {
            "attempt": e.attempt,
            "at": e.at.isoformat(),
            "by": e.by,
            "error": mask_secrets(e.error) if e.error is not None else None,
        }
        for e in history.errors
    ]


def history_lines(history: TaskHistory) -> list[str]:
    """A task's failed attempts as `oncely tasks show` prints them, newest first, each
    error with its traceback, credentials masked."""
    if not history.kept:
        return ["attempts: only the last error is kept (schema older than 11: `oncely migrate`)"]
    if not history.errors:
        return []
    lines = [f"failed attempts ({len(history.errors)}, newest first):"]
    for e in history.errors:
        lines.append(f"  attempt {e.attempt} at {e.at.isoformat()} by {e.by or '-'}:")
        lines += ["    " + line for line in mask_secrets(e.error or "-").rstrip().split("\n")]
    if history.more:
        lines.append(
            f"  (older failed attempts are kept too; the newest {len(history.errors)} shown)"
        )
    return lines


def _compact(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(", ", ": "))


def task_rows(records: Sequence[TaskRecord]) -> list[list[str]]:
    """`oncely tasks` rows: id, task, state, attempt, run at / finished, key, last error."""
    rows = []
    for r in records:
        error = "" if r.state is TaskState.SUCCEEDED else (r.error or "").split("\n", 1)[0]
        error = mask_secrets(error)  # before the cut, which could leave half a URL
        when = r.finished_at if r.finished_at is not None else r.run_at
        rows.append(
            [
                str(r.id),
                r.task,
                r.state.value,
                str(r.attempt),
                iso(when),
                r.idempotency_key or "-",
                error[:60] or "-",
            ]
        )
    return rows


def waited_line(busy: RunResult, waited: Waited) -> str:
    """The line `oncely run --wait` prints once the busy slot's holder is done (or not)."""
    from ..waiting import Held

    head = f"{busy.job} slot {iso(busy.slot)} key {busy.key}"
    took = f"after waiting {waited.waited:.1f} s"
    if waited.held is Held.RAN and waited.claim is not None:
        by = f"{waited.claim.claimed_by} at {iso(waited.claim.claimed_at)}"
        return f"skipped {head}: ran elsewhere (claimed by {by}), {took}"
    if waited.held is Held.FAILED:
        return (
            f"failed {head}: failed elsewhere (rolled back; given up, retried by the job's "
            f"policy, or free if its holder died: `oncely explain` says which), {took}"
        )
    return f"busy {head}: still running elsewhere {took}; outcome unknown"


def retry_text(policy: RetryPolicy) -> str:
    """A retry policy in a few words, e.g. `25 attempts, polynomial from 15 s, +/-10 %`."""
    if policy.attempts == 1:
        return "1 attempt, no retry"
    wait = getattr(policy, "_wait_func", None)
    base = "a custom wait" if wait is not None else f"{policy.backoff} from {policy._wait:g} s"
    jitter = f", +/-{policy.jitter * 100:g} %" if policy.jitter else ""
    return f"{policy.attempts} attempts, {base}{jitter}"


def state_counts(counts: Mapping[str, int]) -> str:
    """Task counts by state, e.g. `available 3, dead 1`; `none` for no rows."""
    return ", ".join(f"{state} {n}" for state, n in sorted(counts.items())) or "none"


def task_def_dict(task: Task, counts: Mapping[str, int]) -> dict[str, Any]:
    """A registered task for `oncely list --json`."""
    return {
        "kind": "task",
        "name": task.name,
        "queue": task.queue,
        "retry": retry_text(task.retry),
        "counts": dict(sorted(counts.items())),
    }


def task_def_row(task: Task, counts: Mapping[str, int]) -> list[str]:
    """A task's row of `oncely list`."""
    return [task.name, task.queue, retry_text(task.retry), state_counts(counts)]


# -- the control plane ----------------------------------------------------------------------


def run_dict(result: RunResult) -> dict[str, Any]:
    """`oncely run --json`: one attempt's outcome as JSON-ready data."""
    error = result.error
    pause = result.pause
    return {
        "status": result.status.value,
        "job": result.job,
        "key": result.key,
        "slot": iso(result.slot) if result.slot else None,
        "duration_ms": round(result.duration * 1000, 1),
        "claimed_by": result.claimed_by,
        "claimed_at": result.claim.claimed_at.isoformat() if result.claim else None,
        "error": f"{type(error).__name__}: {error}" if error is not None else None,
        "paused": pause_dict(pause) if pause is not None else None,
        "given_up": result.given_up,
        "retry_at": result.retry_at.isoformat() if result.retry_at else None,
        "attempts": result.attempts,
        "skipped_by": result.skipped_by,
        "skip_reason": result.skip_reason,
        "done": result.done,
    }


def pause_dict(pause: Pause) -> dict[str, Any]:
    """A pause as JSON-ready data."""
    return {
        "job": pause.job,
        "paused_at": pause.paused_at.isoformat(),
        "paused_by": pause.paused_by,
        "reason": pause.reason,
        "resumed_at": pause.resumed_at.isoformat() if pause.resumed_at else None,
        "resumed_by": pause.resumed_by,
    }


def pause_text(pause: Pause) -> str:
    """`by ACTOR at TIME: REASON` (the reason left out when none was given)."""
    why = f": {pause.reason}" if pause.reason else ""
    return f"by {pause.paused_by} at {iso(pause.paused_at)}{why}"


def paused_line(result: RunResult) -> str:
    """The line `oncely run` prints for a paused job."""
    assert result.pause is not None
    return f"paused {result.job} slot {iso(result.slot)} ({pause_text(result.pause)})"


def planned_dict(p: PlannedSlot) -> dict[str, Any]:
    """One slot of a backfill plan as JSON-ready data."""
    return {
        "slot": iso(p.slot),
        "key": p.key,
        "action": p.action,
        "claimed_by": p.claim.claimed_by if p.claim else None,
        "claimed_at": p.claim.claimed_at.isoformat() if p.claim else None,
        "running_by": p.running.replica if p.running else None,
        "running_since": iso(p.running.started_at) if p.running else None,
    }


def planned_row(p: PlannedSlot) -> list[str]:
    """A row of a backfill plan: slot, key, what --apply would do."""
    what = p.action
    if p.claim is not None:
        what = f"already ran by {p.claim.claimed_by} at {iso(p.claim.claimed_at)}"
    elif p.running is not None:
        what = f"running now by {p.running.replica} since {iso(p.running.started_at)}"
    elif p.action == "not due":
        what = "not due (later than the database's clock)"
    elif p.action == "given up":
        what = "given up (an attempt failed or was cancelled: `oncely release` frees it)"
    return [iso(p.slot), p.key, what]


def attempt_dict(a: Attempt) -> dict[str, Any]:
    """An attempt record as JSON-ready data."""
    return {
        "id": a.id,
        "outcome": a.outcome or ("running" if a.alive else "died"),
        "replica": a.replica,
        "started_at": a.started_at.isoformat() if a.started_at else None,
        "finished_at": a.finished_at.isoformat() if a.finished_at else None,
        "error_class": a.error_class,
        "error": a.error,
        "cancel_requested_by": a.cancel_requested_by,
        "given_up": a.final,
        "retry_at": a.retry_at.isoformat() if a.retry_at else None,
    }


def explanation_dict(e: Explanation) -> dict[str, Any]:
    """`oncely explain --json`."""
    fields = {k: v for k, v in e.fields.items() if k != "attempts"}
    return {
        "job": e.job,
        "key": e.key,
        "slot": iso(e.slot),
        "answer": e.answer,
        "sentence": e.sentence,
        "fields": fields,
        "attempts": [attempt_dict(a) for a in e.attempts],
    }


def explanation_lines(e: Explanation) -> list[str]:
    """`oncely explain`: the sentence, the fields, then one line per attempt."""
    lines = [e.sentence, f"  answer: {e.answer}", f"  key: {e.key}"]
    for name, value in e.fields.items():
        if name != "attempts" and value is not None:
            lines.append(f"  {name}: {value}")
    for a in e.attempts:
        d = attempt_dict(a)
        error = f" {d['error_class']}: {d['error']}" if d["error_class"] else ""
        lines.append(
            f"  attempt {a.id}: {d['outcome']} by {a.replica} at {iso(a.started_at)}{error}"
        )
    return lines


def audit_dict(entry: AuditEntry) -> dict[str, Any]:
    """An audit row as JSON-ready data."""
    return {
        "id": entry.id,
        "at": entry.at.isoformat(),
        "actor": entry.actor,
        "action": entry.action,
        "job": entry.job,
        "target": entry.target,
        "reason": entry.reason,
        "result": entry.result,
    }


def audit_row(entry: AuditEntry) -> list[str]:
    """A row of `oncely audit`."""
    return [
        iso(entry.at),
        entry.actor,
        entry.action,
        entry.target,
        entry.result,
        entry.reason or "-",
    ]
