"""Every statement the task queue runs, named, each with its one purpose.

`now` and `until` are database-time expressions from the dialect (`clock_timestamp()` and
`clock_timestamp() + interval` on Postgres, this machine's clock on SQLite). Leases are
compare-and-set on (id, lease_token): a worker's token changes hands only through `fetch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from .tables import UTCDateTime, runs, tasks

AVAILABLE, RUNNING, SUCCEEDED, DISCARDED, DEAD = (
    "available",
    "running",
    "succeeded",
    "discarded",
    "dead",
)
FINISHED = (SUCCEEDED, DISCARDED, DEAD)

KEYED = tasks.c.idempotency_key.is_not(None)
"""The predicate of the idempotency index: an enqueue's conflict target names it (a unique
index over all rows, schema v2's, satisfies it too)."""

_FETCHED = (tasks.c.id, tasks.c.task, tasks.c.args, tasks.c.attempt, tasks.c.queue)


def enqueue(insert: Any, created_at: Any, run_at: Any) -> Any:
    """Insert one task per parameter set (p_task, p_queue, p_args, p_key, p_run_at, p_delay),
    executemany; a row whose (task, idempotency_key) exists is skipped. RETURNING the new rows.
    Postgres inserts them all in one round trip instead (postgres.ENQUEUE)."""
    return (
        insert(tasks)
        .values(
            task=sa.bindparam("p_task"),
            queue=sa.bindparam("p_queue"),
            args=sa.bindparam("p_args", type_=tasks.c.args.type),
            state=AVAILABLE,
            attempt=0,
            run_at=run_at,
            created_at=created_at,
            idempotency_key=sa.bindparam("p_key", type_=sa.String()),
        )
        .on_conflict_do_nothing(
            index_elements=[tasks.c.task, tasks.c.idempotency_key], index_where=KEYED
        )
        .returning(*ENQUEUED)
    )


ENQUEUED = (tasks.c.id, tasks.c.task, tasks.c.idempotency_key, tasks.c.run_at, tasks.c.created_at)
"""What an enqueue reads back of each new row (the rest it knows already)."""


def enqueue_times() -> tuple[Any, Any]:
    """The bound run_at (a time or NULL) and delay (seconds) of an enqueue's parameter set."""
    return (
        sa.bindparam("p_run_at", type_=tasks.c.run_at.type),
        sa.bindparam("p_delay", type_=sa.Float()),
    )


def by_keys(task: str, keys: Sequence[str]) -> sa.Select[Any]:
    """The retained tasks of one task name with these idempotency keys."""
    return sa.select(tasks).where(tasks.c.task == task, tasks.c.idempotency_key.in_(keys))


def fetch(
    queues: Sequence[str] | None, now: Any, until: Any, names: Sequence[str] | None = None
) -> Any:
    """Lease up to :p_limit due tasks (skipping rows other workers hold) for :p_token and
    :p_by: one attempt each. Built once per worker; `until` is the lease's end.

    `names`: only tasks of these names (the ones the worker has registered), so a task that
    a worker of another release does not know waits for one that does. A plain IN list on
    the column: the due index (run_at, id of available rows) still drives the scan, and the
    filter is checked on the rows it yields.
    """
    due = (
        sa.select(tasks.c.id)
        .where(tasks.c.state == AVAILABLE, tasks.c.run_at <= now)
        .order_by(tasks.c.run_at, tasks.c.id)
        .limit(sa.bindparam("p_limit", type_=sa.Integer()))
        .with_for_update(skip_locked=True)
    )
    if queues is not None:
        due = due.where(tasks.c.queue.in_(list(queues)))
    if names is not None:
        due = due.where(tasks.c.task.in_(list(names)))
    return (
        sa.update(tasks)
        .where(tasks.c.id.in_(due.scalar_subquery()))
        .values(
            state=RUNNING,
            attempt=tasks.c.attempt + 1,
            lease_token=sa.bindparam("p_token", type_=sa.String()),
            locked_by=sa.bindparam("p_by", type_=sa.String()),
            started_at=now,
            lease_expires_at=until,
            finished_at=None,
        )
        .returning(*_FETCHED)
    )


def ack(now: Any) -> Any:
    """Mark the leased tasks :p_ids succeeded iff their lease (:p_token) is still ours;
    RETURNING the ids that were.

    Runs in the batch's transaction after the tasks' work, so each task's ack commits with its
    work; a task whose lease was taken over meanwhile matches no row. Built once.
    """
    return (
        sa.update(tasks)
        .where(
            tasks.c.id.in_(sa.bindparam("p_ids", expanding=True)),
            tasks.c.lease_token == sa.bindparam("p_token", type_=sa.String()),
            tasks.c.state == RUNNING,
        )
        .values(state=SUCCEEDED, finished_at=now, lease_expires_at=None)
        .returning(tasks.c.id)
    )


def record_outcome(
    task_id: int, token: str, state: str, run_at: Any, error: str | None, now: Any
) -> sa.Update:
    """After a task's work rolled back: its retry time (available) or its end (discarded/dead),
    iff the lease is still ours."""
    values: dict[str, Any] = {"state": state, "error": error, "lease_expires_at": None}
    if state == AVAILABLE:
        values.update(run_at=run_at, finished_at=None, lease_token=None)
    else:
        values["finished_at"] = now
    return (
        sa.update(tasks)
        .where(tasks.c.id == task_id, tasks.c.lease_token == token, tasks.c.state == RUNNING)
        .values(**values)
    )


def heartbeat(ids: Sequence[int], tokens: Sequence[str], until: Any) -> Any:
    """Extend the leases this worker still holds; RETURNING the ids whose lease was extended."""
    held = (
        sa.select(tasks.c.id)
        .where(
            tasks.c.id.in_(list(ids)),
            tasks.c.lease_token.in_(list(tokens)),
            tasks.c.state == RUNNING,
        )
        .with_for_update(skip_locked=True)
    )
    return (
        sa.update(tasks)
        .where(tasks.c.id.in_(held.scalar_subquery()))
        .values(lease_expires_at=until)
        .returning(tasks.c.id)
    )


def release(ids: Sequence[int], token: str, now: Any, *, started: bool) -> sa.Update:
    """Give back leased tasks now: ones that never started (a worker stopping) lose the
    attempt; ones whose batch rolled back keep it."""
    return (
        sa.update(tasks)
        .where(tasks.c.id.in_(list(ids)), tasks.c.lease_token == token, tasks.c.state == RUNNING)
        .values(
            state=AVAILABLE,
            attempt=tasks.c.attempt if started else tasks.c.attempt - 1,
            run_at=now,
            lease_token=None,
            locked_by=None,
            lease_expires_at=None,
        )
    )


CANCELLED = "Cancelled: the worker shut down before this attempt finished (not counted)"
"""The error recorded on a task whose attempt a shutdown cancelled and handed back."""


def hand_back(ids: Sequence[int], token: str, now: Any) -> Any:
    """Give back tasks whose attempts a shutdown cancelled (their work rolled back): available
    now, the attempt not counted (it was not the task's fault), the error saying why.
    RETURNING the ids handed back (a task another worker took over matches no row)."""
    return (
        sa.update(tasks)
        .where(tasks.c.id.in_(list(ids)), tasks.c.lease_token == token, tasks.c.state == RUNNING)
        .values(
            state=AVAILABLE,
            attempt=sa.case((tasks.c.attempt > 0, tasks.c.attempt - 1), else_=0),
            run_at=now,
            lease_token=None,
            locked_by=None,
            lease_expires_at=None,
            error=CANCELLED,
        )
        .returning(tasks.c.id, tasks.c.task, tasks.c.attempt)
    )


def rescue(now: Any, limit: int) -> Any:
    """Make tasks whose lease ran out (their worker died or stalled) available again."""
    expired = (
        sa.select(tasks.c.id)
        .where(tasks.c.state == RUNNING, tasks.c.lease_expires_at < now)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return (
        sa.update(tasks)
        .where(tasks.c.id.in_(expired.scalar_subquery()))
        .values(
            state=AVAILABLE,
            run_at=now,
            lease_token=None,
            lease_expires_at=None,
            error=sa.literal("LeaseExpired: the worker stopped renewing its lease (it died?)"),
        )
        .returning(tasks.c.id, tasks.c.task, tasks.c.attempt, tasks.c.locked_by)
    )


def listing(state: str | None, task: str | None, limit: int) -> sa.Select[Any]:
    """Tasks newest first, optionally of one state and one task name."""
    stmt = sa.select(tasks).order_by(tasks.c.id.desc()).limit(limit)
    if state is not None:
        stmt = stmt.where(tasks.c.state == state)
    if task is not None:
        stmt = stmt.where(tasks.c.task == task)
    return stmt


def get(task_id: int) -> sa.Select[Any]:
    """One task by id."""
    return sa.select(tasks).where(tasks.c.id == task_id)


def retry_now(task_id: int, now: Any) -> Any:
    """Re-run a dead, discarded or waiting task now, with a fresh set of attempts."""
    return (
        sa.update(tasks)
        .where(tasks.c.id == task_id, tasks.c.state.in_([DEAD, DISCARDED, AVAILABLE]))
        .values(
            state=AVAILABLE,
            attempt=0,
            run_at=now,
            finished_at=None,
            lease_token=None,
            locked_by=None,
            lease_expires_at=None,
        )
        .returning(*tasks.c)
    )


def discard(task_id: int, now: Any) -> Any:
    """Discard a task that has not succeeded; a running attempt then fails its ack."""
    return (
        sa.update(tasks)
        .where(tasks.c.id == task_id, tasks.c.state.in_([AVAILABLE, RUNNING, DEAD]))
        .values(state=DISCARDED, finished_at=now, lease_token=None, lease_expires_at=None)
        .returning(*tasks.c)
    )


PRUNE_BATCH = 5000
"""Rows one prune transaction deletes at most: each batch commits on its own, so no lock
and no transaction of prune's lasts longer than one batch (30-60 ms on a table of 5
million tasks: docs/scale.md)."""

PRUNE_SINCE = sa.bindparam("p_since", type_=UTCDateTime())
"""Where a prune's batch starts: the newest time the previous batch deleted (the first batch:
the earliest time there is). Each batch scans its index from there, not from the start,
over entries of rows the earlier batches deleted (still in the index until a vacuum)."""


def _batch(select: sa.Select[Any]) -> Any:
    """A batch's rows, chosen once: a CTE, materialized on Postgres. As a plain IN subquery
    Postgres may run the LIMIT again for each row it deletes (a nested loop rescans it, and
    rows the statement has deleted are skipped as locked), deleting far past the limit."""
    return select.cte("batch").prefix_with("MATERIALIZED", dialect="postgresql")


def prune_tasks(state: str, before: datetime, limit: int = PRUNE_BATCH) -> Any:
    """Delete up to `limit` tasks of one finished state that finished before `before`, from
    :p_since on, oldest first: one batch of a prune (on the finished index). The outer
    condition is checked again on a row that changed meanwhile (an operator's retry of a dead
    task), so such a row is never deleted; rows another transaction holds are skipped, not
    waited for. RETURNING the finished_at of each row deleted (a count that does not depend
    on the driver's rowcount, which sqlite3 does not give for a WITH; the next :p_since)."""
    old = sa.and_(tasks.c.state == state, tasks.c.finished_at < before)
    chosen = (
        sa.select(tasks.c.id)
        .where(old, tasks.c.finished_at >= PRUNE_SINCE)
        .order_by(tasks.c.finished_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    batch = _batch(chosen)
    doomed = tasks.c.id.in_(sa.select(batch.c.id))
    return sa.delete(tasks).where(doomed, old).returning(tasks.c.finished_at)


def prune_claims(before: datetime, limit: int = PRUNE_BATCH) -> Any:
    """Delete up to `limit` slot claims made before `before` (their slots can then run again:
    see docs), from :p_since on, oldest first: one batch of a prune; RETURNING the claimed_at
    of each claim deleted."""
    old = runs.c.claimed_at < before
    chosen = (
        sa.select(runs.c.job, runs.c.key)
        .where(old, runs.c.claimed_at >= PRUNE_SINCE)
        .order_by(runs.c.claimed_at)
        .limit(limit)
    )
    batch = _batch(chosen)
    doomed = sa.tuple_(runs.c.job, runs.c.key).in_(sa.select(batch.c.job, batch.c.key))
    return sa.delete(runs).where(doomed, old).returning(runs.c.claimed_at)


def counts() -> sa.Select[Any]:
    """How many tasks are in each state."""
    return sa.select(tasks.c.state, sa.func.count()).group_by(tasks.c.state)


def counts_by_task() -> sa.Select[Any]:
    """How many tasks each task name has in each state (`oncely list`)."""
    return sa.select(tasks.c.task, tasks.c.state, sa.func.count()).group_by(
        tasks.c.task, tasks.c.state
    )


def clear() -> sa.Delete:
    """Delete every task (test databases only)."""
    return sa.delete(tasks)
