"""Every statement oncely runs against its tables, named, each with its one purpose.

Statements that read the same on both databases are SQLAlchemy Core here; the few whose
text differs (the claim's conflict clause, locks, database time) come from the dialect
files `postgres.py` and `sqlite.py`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.dml import Insert

from .tables import (
    MARKED,
    UTCDateTime,
    attempts,
    audit,
    duplicates,
    jobs,
    pauses,
    runs,
    schema_versions,
    task_cancels,
    tasks,
)

NOW = sa.bindparam("now", type_=UTCDateTime())
"""Database time as a bound value, for a database with no clock of its own (SQLite)."""


# The claim and the finish are built once per database (Dialect.claim_statement,
# Dialect.finish_statement) and executed with parameters: building a Core statement and its
# cache key costs 100-170 µs of CPU, more than the rest of a claim.


def claim_bound(insert: Any, now: Any) -> Insert:
    """Claim (job, key): insert the ledger row unless it exists; RETURNING 1 if it is ours.

    Bound parameters :job, :key, :scheduled_for, :claimed_by (and :now if `now` is NOW).
    """
    stmt: Insert = (
        insert(runs)
        .values(
            job=sa.bindparam("job", type_=runs.c.job.type),
            key=sa.bindparam("key", type_=runs.c.key.type),
            scheduled_for=sa.bindparam("scheduled_for", type_=runs.c.scheduled_for.type),
            claimed_at=now,
            claimed_by=sa.bindparam("claimed_by", type_=runs.c.claimed_by.type),
        )
        .on_conflict_do_nothing()
        .returning(sa.literal(1))
    )
    return stmt


def finish_bound(now: Any) -> sa.Update:
    """Stamp the end of a run on its claim, just before the commit.

    Bound parameters :claim_job, :claim_key (and :now if `now` is NOW).
    SQLAlchemy reserves the column names (:job, :key) for an UPDATE's SET clause.
    """
    return (
        sa.update(runs)
        .where(runs.c.job == sa.bindparam("claim_job"), runs.c.key == sa.bindparam("claim_key"))
        .values(finished_at=now)
    )


def get_claim(job: str, key: str) -> sa.Select[Any]:
    """The claim of one slot, if any."""
    return sa.select(runs).where(runs.c.job == job, runs.c.key == key)


def has_claim(job: Any, key: Any) -> sa.Select[Any]:
    """Whether a slot was claimed (a row: 1) or not (no row); `job` and `key` are values or
    bound parameters."""
    return sa.select(sa.literal_column("1")).where(runs.c.job == job, runs.c.key == key)


def history(job: str | None, limit: int) -> sa.Select[Any]:
    """Claims, newest first, of one job or of all."""
    stmt = sa.select(runs).order_by(runs.c.claimed_at.desc(), runs.c.job, runs.c.key)
    if job is not None:
        stmt = stmt.where(runs.c.job == job)
    return stmt.limit(limit)


def _jobs() -> Any:
    """The distinct jobs of the ledger, one index descent each (a loose scan of the primary
    key: WITH RECURSIVE, the next job after the last), not a read of every claim."""
    first = sa.select(sa.func.min(runs.c.job).label("job")).cte("jobs", recursive=True)
    later = runs.alias("later")
    following = sa.select(sa.func.min(later.c.job)).where(later.c.job > first.c.job)
    step = sa.select(following.scalar_subquery()).where(first.c.job.is_not(None))
    return first.union_all(step)


def last_claims() -> sa.Select[Any]:
    """The newest claim of each job: per job, the end of its (job, claimed_at) index."""
    jobs = _jobs()
    own = runs.alias("own")
    newest = (
        sa.select(
            jobs.c.job,
            sa.select(sa.func.max(own.c.claimed_at))
            .where(own.c.job == jobs.c.job)
            .scalar_subquery()
            .label("claimed_at"),
        )
        .where(jobs.c.job.is_not(None))
        .subquery()
    )
    return sa.select(runs).join(
        newest, sa.and_(runs.c.job == newest.c.job, runs.c.claimed_at == newest.c.claimed_at)
    )


def last_slots() -> sa.Select[Any]:
    """The newest claimed slot time of each job: where the worker's catch-up looks back from;
    per job, the end of its (job, scheduled_for) index (schema v10)."""
    jobs = _jobs()
    own = runs.alias("own")
    slot = sa.select(sa.func.max(own.c.scheduled_for)).where(own.c.job == jobs.c.job)
    return sa.select(jobs.c.job, slot.scalar_subquery().label("slot")).where(
        jobs.c.job.is_not(None)
    )


def release(job: str, key: str) -> Any:
    """Delete one claim so its slot can run again; RETURNING the row that was there."""
    return sa.delete(runs).where(runs.c.job == job, runs.c.key == key).returning(*runs.c)


def release_marks(job: str, key: str) -> sa.Update:
    """Clear a slot's given-up mark and retry time, so that it may run again (and its retry
    policy counts from one)."""
    return (
        sa.update(attempts)
        .where(attempts.c.job == job, attempts.c.key == key, MARKED)
        .values(final=None, retry_at=None)
    )


def slot_marks(job: Any, key: Any, now: Any) -> Any:
    """A slot's fate so far, read after its lock is taken: whether an attempt gave it up, the
    latest retry time, how many marked attempts its retry policy counts, and database now
    (`job` and `key` are values or bound parameters)."""
    return sa.select(
        sa.func.max(sa.case((attempts.c.final, 1), else_=0)).label("final"),
        sa.func.max(attempts.c.retry_at).label("retry_at"),
        sa.func.count().label("tries"),
        sa.type_coerce(now, UTCDateTime()).label("now"),
    ).where(attempts.c.job == job, attempts.c.key == key, MARKED)


SAVEPOINT = sa.text("SAVEPOINT oncely_attempt")
"""Taken once the slot is locked and claimed, before the job's work: what a failed attempt
rolls back to, keeping the slot's lock to record its fate."""
ROLLBACK_TO_SAVEPOINT = sa.text("ROLLBACK TO SAVEPOINT oncely_attempt")
"""Undo a failed attempt's work (the lock stays held: it was taken before the savepoint)."""


def unclaim(job: str, key: str) -> sa.Delete:
    """Delete the attempt's own uncommitted claim before it records the slot's fate."""
    return sa.delete(runs).where(runs.c.job == job, runs.c.key == key)


def claims_of(job: str, keys: list[str]) -> sa.Select[Any]:
    """The claims of some slots of one job."""
    return sa.select(runs).where(runs.c.job == job, runs.c.key.in_(keys))


def pending_retries(jobs: list[str], since: Any, limit: int) -> sa.Select[Any]:
    """The slots of some jobs (their time at or after `since`) that wait for their retry
    policy: a retry time, no final mark and no claim; what any worker of the jobs runs when
    it comes due, whoever scheduled it (the `(job, slot)` index bounds the read)."""
    gave_up = attempts.alias("gave_up")
    return (
        sa.select(
            attempts.c.job,
            attempts.c.key,
            attempts.c.slot,
            sa.func.max(attempts.c.retry_at).label("retry_at"),
        )
        .where(
            attempts.c.job.in_(jobs),
            attempts.c.slot >= since,
            attempts.c.retry_at.is_not(None),
            attempts.c.key.is_not(None),
            ~sa.exists().where(runs.c.job == attempts.c.job, runs.c.key == attempts.c.key),
            ~sa.exists().where(
                gave_up.c.job == attempts.c.job, gave_up.c.key == attempts.c.key, gave_up.c.final
            ),
        )
        .group_by(attempts.c.job, attempts.c.key, attempts.c.slot)
        .order_by(sa.func.max(attempts.c.retry_at))
        .limit(limit)
    )


def slot_of_key(job: str, key: str) -> sa.Select[Any]:
    """The newest slot time recorded for one key of a job (its attempts' records)."""
    return sa.select(sa.func.max(attempts.c.slot)).where(
        attempts.c.job == job, attempts.c.key == key
    )


def given_up_of(job: str, keys: list[str]) -> sa.Select[Any]:
    """The keys, among some slots of one job, that an attempt gave up (final, not released)."""
    return (
        sa.select(attempts.c.key)
        .where(attempts.c.job == job, attempts.c.key.in_(keys), attempts.c.final)
        .distinct()
    )


def job_history(job: str) -> sa.Select[Any]:
    """How many claims, attempt records (given-up, skipped, retry and missed marks with them)
    and pauses a job has: what a rename looks at on both sides."""
    counted = [
        sa.select(sa.func.count()).select_from(t).where(t.c.job == job).scalar_subquery()
        for t in (runs, attempts, pauses)
    ]
    return sa.select(*counted)


def rename_rows(old: str, new: str, *, with_duplicates: bool) -> list[sa.Update]:
    """Carry a job's claims, attempt records, pauses (open and closed) and suppressed
    duplicates to a new name that has none of them, one statement per table (claims first)."""
    tables = [runs, attempts, pauses, *([duplicates] if with_duplicates else [])]
    return [sa.update(t).where(t.c.job == old).values(job=new) for t in tables]


def rename_audit(old: str, new: str) -> sa.Update:
    """Carry the audit rows that name a job to its new name, their targets with them (a
    release's `OLD KEY` becomes `NEW KEY`, which is how explain and verify find it)."""
    rest = sa.func.substr(audit.c.target, len(old) + 1)
    named = sa.or_(
        audit.c.target == old, sa.func.substr(audit.c.target, 1, len(old) + 1) == f"{old} "
    )
    target = sa.case((named, sa.literal(new) + rest), else_=audit.c.target)
    return sa.update(audit).where(audit.c.job == old).values(job=new, target=target)


def rename_first_seen(old: str, new: str) -> list[Any]:
    """Give a job's new name the earlier of the two first appearances, and drop the old
    name's (a worker of the release with the new name may have recorded one already)."""
    other = jobs.alias("other")
    theirs = sa.select(other.c.first_seen).where(other.c.name == old).scalar_subquery()
    later = sa.delete(jobs).where(jobs.c.name == new, jobs.c.first_seen >= theirs)
    kept = sa.exists().where(other.c.name == new)
    moved = sa.update(jobs).where(jobs.c.name == old, ~kept).values(name=new)
    return [later, moved, sa.delete(jobs).where(jobs.c.name == old)]


def clear() -> sa.Delete:
    """Delete every claim (test databases only)."""
    return sa.delete(runs)


def schema_version() -> sa.Select[Any]:
    """The newest applied migration."""
    return sa.select(sa.func.max(schema_versions.c.version))


def record_version(version: int, now: Any) -> sa.Insert:
    """Mark one migration as applied."""
    return sa.insert(schema_versions).values(version=version, applied_at=now)


# -- the control plane: attempts, pauses, the audit trail, cancel requests ----------------


def record_attempt(values: dict[str, Any]) -> Any:
    """Record an attempt (or an overlap skip, a missed range) outside the job's transaction."""
    return sa.insert(attempts).values(**values).returning(attempts.c.id)


def end_attempt(attempt_id: int, values: dict[str, Any]) -> sa.Update:
    """Record what a running attempt came to (once: its outcome is still empty)."""
    return (
        sa.update(attempts)
        .where(attempts.c.id == attempt_id, attempts.c.outcome.is_(None))
        .values(**values)
    )


def forget_attempt(attempt_id: int) -> sa.Delete:
    """Delete an attempt recorded before its claim that did not claim (busy, ran before)."""
    return sa.delete(attempts).where(attempts.c.id == attempt_id)


def slot_attempts(job: str, key: str, slot: Any) -> sa.Select[Any]:
    """The records of one slot, oldest first: its attempts and the missed ranges it is in."""
    in_range = sa.and_(
        attempts.c.outcome == "missed", attempts.c.slot <= slot, attempts.c.slot_last >= slot
    )
    return (
        sa.select(attempts)
        .where(attempts.c.job == job, sa.or_(attempts.c.key == key, in_range))
        .order_by(attempts.c.id)
    )


def running_attempts(job: str, key: str | None) -> sa.Select[Any]:
    """Attempts of a job (at one slot) with no outcome yet: running, or their process died."""
    stmt = sa.select(attempts).where(
        attempts.c.job == job, attempts.c.outcome.is_(None), attempts.c.started_at.is_not(None)
    )
    if key is not None:
        stmt = stmt.where(attempts.c.key == key)
    return stmt.order_by(attempts.c.id)


def request_cancel(attempt_id: int, now: Any, actor: str) -> sa.Update:
    """Ask a running attempt to stop; it reads the request while it runs."""
    return (
        sa.update(attempts)
        .where(attempts.c.id == attempt_id, attempts.c.outcome.is_(None))
        .values(cancel_requested_at=now, cancel_requested_by=actor)
    )


def cancel_request(attempt_id: int) -> sa.Select[Any]:
    """Who asked a running attempt to stop, if anyone."""
    return sa.select(attempts.c.cancel_requested_by).where(
        attempts.c.id == attempt_id, attempts.c.cancel_requested_at.is_not(None)
    )


def pause(job: str, now: Any, actor: str, reason: str | None) -> Any:
    """Put a pause of a job in force (the unique index refuses a second one)."""
    return (
        sa.insert(pauses)
        .values(job=job, paused_at=now, paused_by=actor, reason=reason)
        .returning(*pauses.c)
    )


def resume(job: str, now: Any, actor: str) -> Any:
    """End the pause in force of a job; RETURNING it."""
    return (
        sa.update(pauses)
        .where(pauses.c.job == job, pauses.c.resumed_at.is_(None))
        .values(resumed_at=now, resumed_by=actor)
        .returning(*pauses.c)
    )


def pauses_in_force() -> sa.Select[Any]:
    """Every pause in force."""
    return sa.select(pauses).where(pauses.c.resumed_at.is_(None))


def pause_covering(job: str, slot: Any) -> sa.Select[Any]:
    """The pause of one job whose interval [paused_at, resumed_at) holds a slot's time, if any."""
    return (
        sa.select(pauses)
        .where(
            pauses.c.job == job,
            pauses.c.paused_at <= slot,
            sa.or_(pauses.c.resumed_at.is_(None), pauses.c.resumed_at > slot),
        )
        .order_by(pauses.c.paused_at.desc())
        .limit(1)
    )


def job_pauses(job: str) -> sa.Select[Any]:
    """Every pause of a job, oldest first (what explain reads)."""
    return sa.select(pauses).where(pauses.c.job == job).order_by(pauses.c.id)


def pauses_since(since: Any) -> sa.Select[Any]:
    """Every pause still open or ended after `since` (None: all), oldest first: the worker's
    intervals for the slots it has yet to decide."""
    stmt = sa.select(pauses).order_by(pauses.c.paused_at, pauses.c.id)
    if since is not None:
        stmt = stmt.where(sa.or_(pauses.c.resumed_at.is_(None), pauses.c.resumed_at > since))
    return stmt


def audit_row(values: dict[str, Any]) -> sa.Insert:
    """One row of the audit trail, in the action's own transaction."""
    return sa.insert(audit).values(**values)


def audit_trail(job: str | None, limit: int) -> sa.Select[Any]:
    """The audit trail newest first, of one job or of all."""
    stmt = sa.select(audit).order_by(audit.c.id.desc()).limit(limit)
    if job is not None:
        stmt = stmt.where(audit.c.job == job)
    return stmt


def discard_unstarted(task_id: int, now: Any, error: str) -> Any:
    """Discard a task that is not running (cancelled before it started); RETURNING it."""
    return (
        sa.update(tasks)
        .where(tasks.c.id == task_id, tasks.c.state == "available")
        .values(state="discarded", finished_at=now, error=error)
        .returning(*tasks.c)
    )


def request_task_cancel(task_id: int, now: Any, actor: str) -> Any:
    """Ask the worker running a task to stop it; RETURNING the task id if it is running."""
    when: Any = now if isinstance(now, sa.ClauseElement) else sa.literal(now, UTCDateTime())
    asked = sa.select(task_cancels.c.task_id).where(task_cancels.c.task_id == task_id)
    source = sa.select(tasks.c.id, when, sa.literal(actor, sa.String(255))).where(
        tasks.c.id == task_id, tasks.c.state == "running", ~sa.exists(asked)
    )
    return (
        sa.insert(task_cancels)
        .from_select(["task_id", "requested_at", "requested_by"], source)
        .returning(task_cancels.c.task_id)
    )


def forget_task_cancel(task_id: int) -> sa.Delete:
    """Drop a task's cancel request (it is retried by hand: a fresh start)."""
    return sa.delete(task_cancels).where(task_cancels.c.task_id == task_id)


def task_cancel_requests(ids: list[int]) -> sa.Select[Any]:
    """Which of these tasks an operator asked to cancel."""
    return sa.select(task_cancels.c.task_id).where(task_cancels.c.task_id.in_(ids))


def task_cancel_request(task_id: int) -> sa.Select[Any]:
    """The cancel request of one task, if any."""
    return sa.select(task_cancels).where(task_cancels.c.task_id == task_id)


def prune_attempts(before: Any) -> sa.Delete:
    """Delete attempt records older than `before` (explain then says less about old slots)."""
    return sa.delete(attempts).where(attempts.c.recorded_at < before)


def prune_pauses(before: Any) -> sa.Delete:
    """Delete pauses that ended before `before`."""
    return sa.delete(pauses).where(pauses.c.resumed_at < before)


def prune_task_cancels() -> sa.Delete:
    """Delete cancel requests of tasks that are no longer running."""
    running = sa.select(tasks.c.id).where(tasks.c.state == "running")
    return sa.delete(task_cancels).where(task_cancels.c.task_id.not_in(running))


# -- the dashboard's reads: bounded by an index, never a whole table ----------------------


def claims_of_slots(pairs: list[tuple[str, str]]) -> sa.Select[Any]:
    """The claims of some (job, key) slots of any jobs (the primary key)."""
    return sa.select(runs).where(sa.tuple_(runs.c.job, runs.c.key).in_(pairs))


def records_of_slots(pairs: list[tuple[str, str]]) -> sa.Select[Any]:
    """The attempt records of some (job, key) slots of any jobs, oldest first."""
    return (
        sa.select(attempts)
        .where(sa.tuple_(attempts.c.job, attempts.c.key).in_(pairs))
        .order_by(attempts.c.id)
    )


def window_records(job: str, first: Any, last: Any) -> sa.Select[Any]:
    """The attempt records of a job's slots in [first, last], oldest first (a timeline)."""
    return (
        sa.select(attempts)
        .where(attempts.c.job == job, attempts.c.slot >= first, attempts.c.slot <= last)
        .order_by(attempts.c.id)
    )


def record_duplicate(values: dict[str, Any]) -> sa.Insert:
    """Record a suppressed duplicate attempt at a claimed slot."""
    return sa.insert(duplicates).values(**values)


def prune_duplicates(before: Any) -> sa.Delete:
    """Delete duplicate records older than `before`."""
    return sa.delete(duplicates).where(duplicates.c.recorded_at < before)


def duplicates_of(job: str, keys: list[str]) -> sa.Select[Any]:
    """(key, count) of the suppressed duplicates of some slots of a job."""
    return (
        sa.select(duplicates.c.key, sa.func.count())
        .where(duplicates.c.job == job, duplicates.c.key.in_(keys))
        .group_by(duplicates.c.key)
    )


def duplicates_since(since: Any, cap: int) -> sa.Select[Any]:
    """How many duplicates were recorded since `since`, counting at most `cap`."""
    recent = (
        sa.select(duplicates.c.id).where(duplicates.c.recorded_at >= since).limit(cap).subquery()
    )
    return sa.select(sa.func.count()).select_from(recent)


def records_by_minute(minute: Any, outcomes: list[str], since: Any, cap: int) -> sa.Select[Any]:
    """(minute, count) of the newest `cap` attempt records of these outcomes since `since`."""
    recent = (
        sa.select(attempts.c.recorded_at)
        .where(attempts.c.recorded_at >= since, attempts.c.outcome.in_(outcomes))
        .order_by(attempts.c.recorded_at.desc())
        .limit(cap)
        .subquery()
    )
    bucket = minute(recent.c.recorded_at).label("minute")
    return sa.select(bucket, sa.func.count()).group_by(bucket)


def duplicates_by_minute(minute: Any, since: Any, cap: int) -> sa.Select[Any]:
    """(minute, count) of the newest `cap` duplicates recorded since `since`."""
    recent = (
        sa.select(duplicates.c.recorded_at)
        .where(duplicates.c.recorded_at >= since)
        .order_by(duplicates.c.recorded_at.desc())
        .limit(cap)
        .subquery()
    )
    bucket = minute(recent.c.recorded_at).label("minute")
    return sa.select(bucket, sa.func.count()).group_by(bucket)


def claims_by_minute(minute: Any, since: Any, cap: int) -> sa.Select[Any]:
    """(minute, count) of the newest `cap` claims made since `since`."""
    recent = (
        sa.select(runs.c.claimed_at)
        .where(runs.c.claimed_at >= since)
        .order_by(runs.c.claimed_at.desc())
        .limit(cap)
        .subquery()
    )
    bucket = minute(recent.c.claimed_at).label("minute")
    return sa.select(bucket, sa.func.count()).group_by(bucket)


def series_by_minute(series: dict[str, sa.Select[Any]]) -> Any:
    """Several (minute, count) reads as one: (series, minute, count) rows, one round trip."""
    parts = []
    for name, stmt in series.items():
        sub = stmt.subquery()
        minute, count = sub.c[0], sub.c[1]
        parts.append(sa.select(sa.literal(name).label("series"), minute, count))
    return sa.union_all(*parts)


def audit_page(
    job: str | None, action: str | None, actor: str | None, before: int | None, limit: int
) -> sa.Select[Any]:
    """The audit trail newest first, filtered, from before id `before` (keyset)."""
    stmt = sa.select(audit).order_by(audit.c.id.desc()).limit(limit)
    if job is not None:
        stmt = stmt.where(audit.c.job == job)
    if action is not None:
        stmt = stmt.where(audit.c.action == action)
    if actor is not None:
        stmt = stmt.where(audit.c.actor == actor)
    if before is not None:
        stmt = stmt.where(audit.c.id < before)
    return stmt


# -- what `oncely verify` reads: one job's ledger over a window ----------------------------


def record_jobs(insert: Any, names: list[str], now: Any) -> Any:
    """Record the first appearance of some jobs (a job seen before keeps its first)."""
    rows = [{"name": name, "first_seen": now} for name in names]
    return insert(jobs).values(rows).on_conflict_do_nothing(index_elements=[jobs.c.name])


def first_seen(job: str) -> sa.Select[Any]:
    """When a job first appeared (a worker or `oncely run` started with it)."""
    return sa.select(jobs.c.first_seen).where(jobs.c.name == job)


def first_slots(job: str) -> sa.Select[Any]:
    """The oldest slot a job claimed and the oldest one it started an attempt at (indexed)."""
    claimed = sa.select(sa.func.min(runs.c.scheduled_for)).where(runs.c.job == job)
    started = sa.select(sa.func.min(attempts.c.slot)).where(
        attempts.c.job == job, attempts.c.started_at.is_not(None)
    )
    return sa.select(claimed.scalar_subquery(), started.scalar_subquery())


def jobs_first_seen() -> sa.Select[Any]:
    """When each job first appeared (one row per job a worker or `oncely run` started)."""
    return sa.select(jobs.c.name, jobs.c.first_seen)


def claims_between(job: str, since: Any, until: Any) -> sa.Select[Any]:
    """The claims of a job whose slot lies in [since, until], oldest slot first."""
    return (
        sa.select(runs)
        .where(runs.c.job == job, runs.c.scheduled_for >= since, runs.c.scheduled_for <= until)
        .order_by(runs.c.scheduled_for, runs.c.claimed_at)
    )


def records_between(job: str, since: Any, until: Any) -> sa.Select[Any]:
    """The attempt records of a job's slots in [since, until], and the missed ranges that
    reach into it, oldest first."""
    reaches = sa.and_(attempts.c.outcome == "missed", attempts.c.slot_last >= since)
    return (
        sa.select(attempts)
        .where(
            attempts.c.job == job,
            attempts.c.slot <= until,
            sa.or_(attempts.c.slot >= since, reaches),
        )
        .order_by(attempts.c.id)
    )


def releases_since(job: str, since: Any, key: str | None = None) -> sa.Select[Any]:
    """The operators' releases of a job's slots (at or after `since`, if given; of one `key`,
    if given), oldest first."""
    stmt = sa.select(
        audit.c.at, audit.c.target, audit.c.result, audit.c.actor, audit.c.reason
    ).where(audit.c.job == job, audit.c.action == "release")
    if since is not None:
        stmt = stmt.where(audit.c.at >= since)
    if key is not None:
        stmt = stmt.where(audit.c.target == f"{job} {key}")
    return stmt.order_by(audit.c.id)
