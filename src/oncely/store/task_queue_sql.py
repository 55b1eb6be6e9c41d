"""Every statement the task queue runs, named, each with its one purpose.

`now` and `until` are database-time expressions from the dialect (`clock_timestamp()` and
`clock_timestamp() + interval` on Postgres, this machine's clock on SQLite). Leases are
compare-and-set on (id, lease_token): a worker's token changes hands only through `fetch`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import BindParameter

from .tables import (
    LEASE_ORDER,
    LIMITED,
    UNLIMITED,
    UTCDateTime,
    runs,
    task_errors,
    task_starts,
    tasks,
    workers,
)

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


def enqueue(insert: Any, created_at: Any, run_at: Any) -> Any:
    """Insert one task per parameter set (p_task, p_queue, p_args, p_key, p_run_at, p_delay,
    p_trace and the limits: p_priority, p_ckey, p_conc, p_rkey, p_rate, p_period),
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
            trace_context=sa.bindparam("p_trace", type_=sa.Text()),
            **limit_values(),
        )
        .on_conflict_do_nothing(
            index_elements=[tasks.c.task, tasks.c.idempotency_key], index_where=KEYED
        )
        .returning(*ENQUEUED)
    )


LIMIT_PARAMS: dict[str, tuple[str, Any]] = {
    "priority": ("p_priority", sa.Integer()),
    "concurrency_key": ("p_ckey", sa.String()),
    "concurrency": ("p_conc", sa.Integer()),
    "rate_key": ("p_rkey", sa.String()),
    "rate": ("p_rate", sa.Integer()),
    "rate_period": ("p_period", sa.Float()),
}
"""Each limit column of an enqueue, its parameter and type (values from the entry's key of
the column's name)."""


def limit_values() -> dict[str, Any]:
    """The bound limit columns of an enqueue's row."""
    return {column: sa.bindparam(p, type_=t) for column, (p, t) in LIMIT_PARAMS.items()}


ENQUEUED = (tasks.c.id, tasks.c.task, tasks.c.idempotency_key, tasks.c.run_at, tasks.c.created_at)
"""What an enqueue reads back of each new row (the rest it knows already)."""


def enqueue_times() -> tuple[Any, Any]:
    """The bound run_at (a time or NULL) and delay (seconds) of an enqueue's parameter set."""
    return (
        sa.bindparam("p_run_at", type_=tasks.c.run_at.type),
        sa.bindparam("p_delay", type_=sa.Float()),
    )


RECORD_COLUMNS = tuple(
    tasks.c[name]
    for name in (
        "id", "task", "queue", "args", "state", "attempt", "run_at", "created_at",
        "idempotency_key", "started_at", "finished_at", "locked_by", "lease_expires_at",
        "error", "priority", "result",
    )
)  # fmt: skip
"""What a task's record is made of (`rows.record`)."""


def by_keys(task: Any, keys: Any) -> sa.Select[Any]:
    """The records of the retained tasks of one task name with these idempotency keys (an
    enqueue's duplicates): `keys` a list, or one array parameter (Postgres's driver: one
    prepared statement for any number of keys)."""
    key = tasks.c.idempotency_key
    matching = key.in_(keys) if isinstance(keys, (list, tuple)) else key == sa.any_(keys)
    return sa.select(*RECORD_COLUMNS).where(tasks.c.task == task, matching)


LimitLock = Callable[[str, Any, Any], Any]
"""(kind, task, key) -> an SQL expression that tries, without waiting, to take the limit
group's transaction lock ("c": a concurrency group, "r": a rate group) and is true if it got
it; the dialect's (`Dialect.limit_lock`)."""
Among = Callable[[Any, sa.Select[Any]], Any]
"""`column IN (select)`, as the dialect writes it best (see Dialect.among)."""

FETCHED = (
    tasks.c.id,
    tasks.c.task,
    tasks.c.args,
    tasks.c.attempt,
    tasks.c.queue,
    tasks.c.priority,
    tasks.c.run_at,
    tasks.c.started_at,
    tasks.c.concurrency_key,
    tasks.c.concurrency,
    tasks.c.rate_key,
    tasks.c.rate,
    tasks.c.rate_period,
    tasks.c.trace_context,
)
"""What a lease reads back of each task: what it runs, its lease order, its limits and the
trace it continues; its started_at is NULL if the lease did not count its attempt (leased
ahead: counted when it starts). A lease also reads back its own time (`leased_at`)."""


def _due(
    now: Any,
    limited: Any,
    limit: Any,
    queues: Sequence[str] | None,
    names: Sequence[str] | None,
    *,
    lock: bool,
) -> Any:
    """Due available tasks (free or `limited` ones), in lease order; with `lock`, locked,
    skipping rows other leasers hold."""
    due = (
        sa.select(*(c for c in tasks.c if c.name != "args" and c.name != "result"))
        .where(tasks.c.state == AVAILABLE, tasks.c.run_at <= now, limited)
        .order_by(*LEASE_ORDER)
        .limit(limit)
    )
    if lock:
        due = due.with_for_update(skip_locked=True)
    if queues is not None:
        due = due.where(tasks.c.queue.in_(list(queues)))
    if names is not None:
        due = due.where(tasks.c.task.in_(list(names)))
    return due


def _admitted(now: Any, lim: Any) -> Any:
    """Of the limited candidates `lim`: the ones their groups have room for now.

    A candidate is admitted if its rank in its concurrency group (task, concurrency_key) is
    within the limit minus the group's live leases, and its rank in its rate group (task,
    rate_key) within the rate minus the starts of the last period.
    """
    order = [lim.c.priority.desc(), lim.c.run_at, lim.c.id]
    ranked = sa.select(
        lim,
        sa.func.row_number()
        .over(partition_by=[lim.c.task, lim.c.concurrency_key], order_by=order)
        .label("c_rank"),
        sa.func.row_number()
        .over(partition_by=[lim.c.task, lim.c.rate_key], order_by=order)
        .label("r_rank"),
    ).cte("ranked")
    c_groups = (
        sa.select(lim.c.task, lim.c.concurrency_key)
        .where(lim.c.concurrency.is_not(None))
        .distinct()
        .cte("c_groups")
    )
    live = tasks.alias("live")
    running = (
        sa.select(live.c.task, live.c.concurrency_key, sa.func.count().label("n"))
        .join(
            c_groups,
            sa.and_(
                live.c.task == c_groups.c.task,
                live.c.concurrency_key == c_groups.c.concurrency_key,
            ),
        )
        .where(
            live.c.state == RUNNING,
            live.c.concurrency.is_not(None),
            live.c.lease_expires_at > now,
        )
        .group_by(live.c.task, live.c.concurrency_key)
        .cte("running")
    )
    r_groups = (
        sa.select(lim.c.task, lim.c.rate_key)
        .where(lim.c.rate.is_not(None))
        .distinct()
        .cte("r_groups")
    )
    started = (
        sa.select(task_starts.c.task, task_starts.c.key, sa.func.count().label("n"))
        .join(
            r_groups,
            sa.and_(
                task_starts.c.task == r_groups.c.task, task_starts.c.key == r_groups.c.rate_key
            ),
        )
        .where(task_starts.c.expires_at > now)
        .group_by(task_starts.c.task, task_starts.c.key)
        .cte("started")
    )
    c_room = ranked.c.concurrency - sa.func.coalesce(running.c.n, 0)
    r_room = ranked.c.rate - sa.func.coalesce(started.c.n, 0)
    admitted = (
        sa.select(ranked)
        .outerjoin(
            running,
            sa.and_(
                ranked.c.task == running.c.task,
                ranked.c.concurrency_key == running.c.concurrency_key,
            ),
        )
        .outerjoin(
            started,
            sa.and_(ranked.c.task == started.c.task, ranked.c.rate_key == started.c.key),
        )
        .where(
            sa.or_(ranked.c.concurrency.is_(None), ranked.c.c_rank <= c_room),
            sa.or_(ranked.c.rate.is_(None), ranked.c.r_rank <= r_room),
        )
        .cte("admitted")
    )
    return admitted


_PICKED: tuple[str, ...] = ("id", "priority", "run_at", "task", "concurrency_key")
_PICKED += ("concurrency", "rate_key", "rate")


def _locked(picked: Any, lock: LimitLock) -> Any:
    """Of the tasks `picked` for this lease: the free ones, and the limited ones whose groups'
    locks this transaction took (a group another leaser holds is skipped: losers do not
    wait). Only the groups of picked tasks are locked, so a lease holds no group it takes
    nothing of."""
    # One lock per group, a volatile expression in the select list of a grouped query:
    # evaluated once per group, for these groups only.
    c_locks = (
        sa.select(
            picked.c.task,
            picked.c.concurrency_key,
            lock("c", picked.c.task, picked.c.concurrency_key).label("got"),
        )
        .where(picked.c.concurrency.is_not(None))
        .group_by(picked.c.task, picked.c.concurrency_key)
        .cte("c_locks")
    )
    r_locks = (
        sa.select(
            picked.c.task,
            picked.c.rate_key,
            lock("r", picked.c.task, picked.c.rate_key).label("got"),
        )
        .where(picked.c.rate.is_not(None))
        .group_by(picked.c.task, picked.c.rate_key)
        .cte("r_locks")
    )
    c_got = sa.exists().where(
        c_locks.c.task == picked.c.task,
        c_locks.c.concurrency_key == picked.c.concurrency_key,
        c_locks.c.got,
    )
    r_got = sa.exists().where(
        r_locks.c.task == picked.c.task, r_locks.c.rate_key == picked.c.rate_key, r_locks.c.got
    )
    return sa.select(picked.c.id).where(
        sa.or_(picked.c.concurrency.is_(None), c_got),
        sa.or_(picked.c.rate.is_(None), r_got),
    )


SCAN = 64
"""Limited candidates a lease looks at beyond twice its batch (see `fetch`)."""


def with_constants_inline(stmt: Any) -> Any:
    """`stmt` with the constants written into its text (the states, a limit's lock prefix,
    the numbers the code fixes), not sent as parameters; what each call binds (`p_*`) and
    the lists a worker filters on stay parameters.

    For a statement a worker repeats on one connection: Postgres plans a prepared
    statement's first five runs with their values, and then keeps one generic plan if it
    costs no more. A state sent as a parameter keeps the partial indexes (`WHERE state =
    'available'`) out of the generic plan, so it never qualifies, and the lease would be
    planned again at every call (2 ms, five times its run on a small table)."""

    def inline(element: Any, **_kw: Any) -> Any:
        if (
            not isinstance(element, BindParameter)
            or element.key.startswith("p_")
            or element.expanding
            or element.required
        ):
            return None
        value = element.value
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return None
        # Written once, here (a bound parameter marked literal_execute would be rendered
        # again at every call): the code's own constants, quoted as standard SQL quotes.
        text = str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"
        return sa.literal_column(text, type_=element.type)

    return visitors.replacement_traverse(stmt, {}, inline)


def fetch(
    queues: Sequence[str] | None,
    now: Any,
    until: Any,
    names: Sequence[str] | None = None,
    lock: LimitLock | None = None,
    among: Among | None = None,
    due_by: Any = None,
) -> Any:
    """Lease up to :p_limit due tasks (skipping rows other workers hold) for :p_token and
    :p_by, highest priority first, then oldest: one attempt each. Built once per worker;
    `until` is the lease's end.

    Free tasks (no limit) come from one index scan in lease order, locked as they are read
    (SKIP LOCKED). Tasks with a concurrency or rate limit come from an index of their own:
    the first :p_scan due ones are ranked in their groups and admitted while their groups
    have room (`_admitted`); the rest wait, unleased, their attempts not counted. Both
    kinds merge in lease order up to :p_limit.

    `names`: only tasks of these names (the ones the worker has registered), so a task that
    a worker of another version of the app does not know waits for one that does. A plain IN list on
    the column: the lease-order index still drives the scan, and the filter is checked on
    the rows it yields.
    """
    lock = lock or (lambda _kind, _task, _key: sa.true())
    among = among or (lambda column, ids: column.in_(ids))
    due_by = now if due_by is None else due_by
    limit = sa.bindparam("p_limit", type_=sa.Integer())
    free = _due(due_by, UNLIMITED, limit, queues, names, lock=True).cte("free")
    scan = sa.bindparam("p_scan", type_=sa.Integer())
    lim = _due(due_by, LIMITED, scan, queues, names, lock=False).cte("lim")
    admitted = _admitted(now, lim)
    both = sa.union_all(
        sa.select(*(free.c[name] for name in _PICKED)),
        sa.select(*(admitted.c[name] for name in _PICKED)),
    ).subquery("both")
    picked = (
        sa.select(both)
        .order_by(both.c.priority.desc(), both.c.run_at, both.c.id)
        .limit(limit)
        .cte("picked")
    )
    # The limited candidates were read, not locked (a lease in a long transaction would
    # otherwise hold every row it looked at); the chosen ones are locked now, skipping those
    # another leaser holds, and checked again (a row leased since is no longer available).
    chosen = (
        sa.select(tasks.c.id)
        .where(among(tasks.c.id, _locked(picked, lock)), tasks.c.state == AVAILABLE)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    # The first :p_start in lease order start at once: their attempts count now (started_at
    # set). The rest (leased ahead: started_at NULL) count when their bodies start
    # (`begin_attempts`): a worker that dies before then spends none of their attempts.
    # What the lease counted is read back from started_at, not from this subquery again:
    # SQLite may evaluate RETURNING's expressions after rows changed.
    first = (
        sa.select(picked.c.id)
        .order_by(picked.c.priority.desc(), picked.c.run_at, picked.c.id)
        .limit(sa.bindparam("p_start", type_=sa.Integer()))
    )
    # A rate-limited task's start is its lease (its rate counts leases): counted at once.
    starts = sa.or_(tasks.c.id.in_(first), tasks.c.rate.is_not(None))
    return with_constants_inline(
        sa.update(tasks)
        .where(tasks.c.id.in_(chosen))
        .values(
            state=RUNNING,
            attempt=tasks.c.attempt + sa.case((starts, 1), else_=0),
            lease_token=sa.bindparam("p_token", type_=sa.String()),
            locked_by=sa.bindparam("p_by", type_=sa.String()),
            started_at=sa.case((starts, now), else_=sa.null()),
            lease_expires_at=until,
            finished_at=None,
        )
        .returning(*FETCHED, sa.type_coerce(now, tasks.c.started_at.type).label("leased_at"))
    )


def begin_attempt(now: Any) -> Any:
    """Count the attempt of a leased task (:p_id) whose body starts now (leased ahead,
    uncounted until then), if its lease (:p_token) is still this worker's (a concurrency-
    limited task's: and not run out); RETURNING its id and attempt. Built once; on a
    worker's control connection (asyncpg) it goes on the driver, as the lease does."""
    return with_constants_inline(
        sa.update(tasks)
        .where(
            tasks.c.id == sa.bindparam("p_id", type_=tasks.c.id.type),
            tasks.c.lease_token == sa.bindparam("p_token", type_=sa.String()),
            tasks.c.state == RUNNING,
            _live(now),
        )
        .values(attempt=tasks.c.attempt + 1, started_at=now)
        .returning(tasks.c.id, tasks.c.attempt)
    )


def begin_attempts(ids: Sequence[int], token: str, now: Any) -> Any:
    """`begin_attempt` for several tasks of one lease token at once (a batch of starts);
    RETURNING (id, attempt) of each counted."""
    return (
        sa.update(tasks)
        .where(
            tasks.c.id.in_(list(ids)),
            tasks.c.lease_token == token,
            tasks.c.state == RUNNING,
            _live(now),
        )
        .values(attempt=tasks.c.attempt + 1, started_at=now)
        .returning(tasks.c.id, tasks.c.attempt)
    )


def hand_back_unrunnable(
    ids: Sequence[int], token: str, until: Any, reason: str, *, counted: bool
) -> Any:
    """Hand back tasks this worker cannot run (an unknown name, arguments that do not bind its
    function: an older version of the app): available again at `until`, the attempt not
    counted (undone if the lease `counted` it), `reason` recorded as the error. RETURNING the
    ids."""
    return _back(ids, token, counted, run_at=until, error=reason).returning(tasks.c.id)


def next_due(
    now: Any,
    since: Any,
    queues: Sequence[str] | None,
    names: Sequence[str] | None,
    *,
    held: bool,
) -> sa.Select[Any]:
    """When the next available task of these queues and names comes due after `since` (the
    start of the worker's last lease; NULL: none), database time now, and with `held`
    whether a task that a limit holds back is due already: when an idle worker that
    notifications wake looks again. A `next_at` at or before `now` is a task that came due
    after that lease looked (a retry written since, a delay that ran out): lease again. The
    first from the index of available tasks by run_at (schema v10), the last from the limited
    tasks' own."""

    def of_ours(stmt: Any) -> Any:
        if queues is not None:
            stmt = stmt.where(tasks.c.queue.in_(list(queues)))
        if names is not None:
            stmt = stmt.where(tasks.c.task.in_(list(names)))
        return stmt

    later = of_ours(
        sa.select(sa.func.min(tasks.c.run_at)).where(
            tasks.c.state == AVAILABLE, tasks.c.run_at > since
        )
    ).scalar_subquery()
    columns = [
        sa.type_coerce(later, tasks.c.run_at.type).label("next_at"),
        sa.type_coerce(now, tasks.c.run_at.type).label("now"),
    ]
    if held:
        due = of_ours(
            sa.select(tasks.c.id).where(tasks.c.state == AVAILABLE, LIMITED, tasks.c.run_at <= now)
        )
        columns.append(sa.exists(due).label("held"))
    return sa.select(*columns)


def live_leases(groups: Sequence[tuple[str, str]], now: Any) -> sa.Select[Any]:
    """How many live leases each of these concurrency groups (task, key) has: what a lease
    checks again, in a fresh snapshot, once it holds the groups' locks (Postgres)."""
    return (
        sa.select(tasks.c.task, tasks.c.concurrency_key, sa.func.count())
        .where(
            tasks.c.state == RUNNING,
            tasks.c.concurrency.is_not(None),
            tasks.c.lease_expires_at > now,
            sa.tuple_(tasks.c.task, tasks.c.concurrency_key).in_(list(groups)),
        )
        .group_by(tasks.c.task, tasks.c.concurrency_key)
    )


def recent_starts(groups: Sequence[tuple[str, str]], since: Any) -> sa.Select[Any]:
    """How many starts each of these rate groups (task, key) has that count after `since`."""
    return (
        sa.select(task_starts.c.task, task_starts.c.key, sa.func.count())
        .where(
            task_starts.c.expires_at > since,
            sa.tuple_(task_starts.c.task, task_starts.c.key).in_(list(groups)),
        )
        .group_by(task_starts.c.task, task_starts.c.key)
    )


def unlease(ids: Sequence[int], token: str, *, counted: bool = True) -> sa.Update:
    """Undo this lease of tasks their group turned out to have no room for (a race another
    leaser won): available again, the attempt not counted (undone if the lease `counted` it)."""
    return _back(ids, token, counted)


def _back(ids: Sequence[int], token: str, counted: bool, **values: Any) -> sa.Update:
    """Tasks of this lease available again, the lease's count of an attempt undone if it
    `counted` one, with `values` besides."""
    return (
        sa.update(tasks)
        .where(tasks.c.id.in_(list(ids)), tasks.c.lease_token == token, tasks.c.state == RUNNING)
        .values(
            state=AVAILABLE,
            attempt=tasks.c.attempt - 1 if counted else tasks.c.attempt,
            lease_token=None,
            locked_by=None,
            lease_expires_at=None,
            **values,
        )
    )


def forget_starts(groups: Sequence[tuple[str, str]], now: Any) -> sa.Delete:
    """Delete the starts of these rate groups that no longer count."""
    return sa.delete(task_starts).where(
        sa.tuple_(task_starts.c.task, task_starts.c.key).in_(list(groups)),
        task_starts.c.expires_at <= now,
    )


def record_starts() -> sa.Insert:
    """Record the starts of rate-limited tasks (executemany of p_task, p_key, p_at, p_until)."""
    return sa.insert(task_starts).values(
        task=sa.bindparam("p_task", type_=sa.String()),
        key=sa.bindparam("p_key", type_=sa.String()),
        started_at=sa.bindparam("p_at", type_=task_starts.c.started_at.type),
        expires_at=sa.bindparam("p_until", type_=task_starts.c.expires_at.type),
    )


def _live(now: Any) -> Any:
    """A lease that still counts: any task's, or a concurrency-limited task's until it ends."""
    return sa.or_(tasks.c.concurrency.is_(None), tasks.c.lease_expires_at > now)


def _ack(ids: Any, now: Any, **values: Any) -> Any:
    """The ack: mark the leased tasks `ids` picks succeeded iff their lease (:p_token) is
    still ours (and, for a task with a concurrency limit, has not run out). Every ack is
    built from it: the batch's, one task's with its result, and Postgres's ack on the driver
    (postgres.TASK_ACK_AND_COMMIT and its function, rendered from `ack_one`)."""
    return (
        sa.update(tasks)
        .where(
            ids,
            tasks.c.lease_token == sa.bindparam("p_token", type_=sa.String()),
            tasks.c.state == RUNNING,
            _live(now),
        )
        .values(state=SUCCEEDED, finished_at=now, lease_expires_at=None, **values)
    )


def ack(now: Any) -> Any:
    """Mark the leased tasks :p_ids succeeded iff their lease (:p_token) is still ours;
    RETURNING the ids that were.

    Runs in the batch's transaction after the tasks' work, so each task's ack commits with its
    work; a task whose lease was taken over meanwhile matches no row, nor does a task with a
    concurrency limit whose lease ran out (its group's slot was free from then on: another
    attempt may be running). Built once.
    """
    return _ack(tasks.c.id.in_(sa.bindparam("p_ids", expanding=True)), now).returning(tasks.c.id)


def ack_with_result(now: Any) -> Any:
    """Mark one leased task (:p_id) succeeded with its return value (:p_result, its JSON
    text, bound) iff its lease (:p_token) is still ours; RETURNING its id if it was. Built
    once; the tasks that returned None take `ack`."""
    return _ack(
        tasks.c.id == sa.bindparam("p_id", type_=tasks.c.id.type),
        now,
        result=sa.bindparam("p_result", type_=sa.Text()),
    ).returning(tasks.c.id)


def ack_one(now: Any) -> Any:
    """Mark one leased task (:p_id) succeeded iff its lease (:p_token) is still ours, its
    constants in its text: what Postgres's ack on the driver is rendered from."""
    return with_constants_inline(
        _ack(tasks.c.id == sa.bindparam("p_id", type_=tasks.c.id.type), now)
    )


def record_outcome(
    task_id: int, token: str, state: str, run_at: Any, error: str | None, now: Any
) -> sa.Update:
    """After a task's work rolled back: its retry time (available) or its end (discarded/dead),
    iff the lease is still ours; RETURNING its id, attempt and the worker that held it (for
    its error's history row)."""
    values: dict[str, Any] = {"state": state, "error": error, "lease_expires_at": None}
    if state == AVAILABLE:
        values.update(run_at=run_at, finished_at=None, lease_token=None)
    else:
        values["finished_at"] = now
    return (
        sa.update(tasks)
        .where(tasks.c.id == task_id, tasks.c.lease_token == token, tasks.c.state == RUNNING)
        .values(**values)
        .returning(tasks.c.id, tasks.c.attempt, tasks.c.locked_by)
    )


_ERROR_COLUMNS = ["task_id", "attempt", "error", "by", "at"]


def record_outcome_and_error(outcome: sa.Update, error: str | None, now: Any) -> Any:
    """A failed attempt's `record_outcome` and its history row in one statement (an UPDATE
    in a WITH, the INSERT from what it returned: where `Dialect.writes_in_with`), so that
    both commit or neither, in a transaction or not; RETURNING the task id (no row: the
    lease was not ours, nothing was written)."""
    done = outcome.cte("done")
    kept = sa.select(done.c.id, done.c.attempt, sa.literal(error, sa.Text()), done.c.locked_by, now)
    return (
        sa.insert(task_errors)
        .from_select(_ERROR_COLUMNS, kept)
        .add_cte(done)
        .returning(task_errors.c.task_id)
    )


def record_errors(now: Any) -> sa.Insert:
    """Keep failed attempts' errors, one row per parameter set (p_task, p_attempt, p_error,
    p_by), executemany, at database time `now` (schema v11)."""
    return sa.insert(task_errors).values(
        task_id=sa.bindparam("p_task"),
        attempt=sa.bindparam("p_attempt"),
        error=sa.bindparam("p_error", type_=sa.Text()),
        by=sa.bindparam("p_by", type_=sa.String()),
        at=now,
    )


def errors_of(task_id: int, limit: int) -> sa.Select[Any]:
    """A task's recorded attempt errors, newest first, at most `limit` (on its index)."""
    return (
        sa.select(task_errors)
        .where(task_errors.c.task_id == task_id)
        .order_by(task_errors.c.id.desc())
        .limit(limit)
    )


def forget_errors(task_ids: Sequence[int]) -> sa.Delete:
    """Delete the attempt errors of these tasks (pruned in the same transaction)."""
    return sa.delete(task_errors).where(task_errors.c.task_id.in_(list(task_ids)))


def heartbeat(ids: Sequence[int], tokens: Sequence[str], until: Any, now: Any) -> Any:
    """Extend the leases this worker still holds; RETURNING the ids whose lease was extended.

    A task with a concurrency limit whose lease ran out is not renewed: its group's slot was
    free from that moment, and another worker may hold it now."""
    held = (
        sa.select(tasks.c.id)
        .where(
            tasks.c.id.in_(list(ids)),
            tasks.c.lease_token.in_(list(tokens)),
            tasks.c.state == RUNNING,
            _live(now),
        )
        .with_for_update(skip_locked=True)
    )
    return (
        sa.update(tasks)
        .where(tasks.c.id.in_(held.scalar_subquery()))
        .values(lease_expires_at=until)
        .returning(tasks.c.id)
    )


def hand_back_unstarted(ids: Sequence[int], token: str, now: Any, *, started: bool) -> sa.Update:
    """Hand back leased tasks now: the attempt the lease counted for ones that never started
    (a worker stopping) is undone; `started` ones (or ones whose attempt was never counted)
    keep the count they have."""
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


def hand_back_cancelled(ids: Sequence[int], token: str, now: Any, *, counted: bool = True) -> Any:
    """Hand back tasks whose attempts a shutdown cancelled (their work rolled back): available
    now, the attempt not counted (it was not the task's fault; undone if it was `counted`),
    the error saying why. RETURNING the ids handed back (a task another worker took over
    matches no row)."""
    attempt: Any = tasks.c.attempt
    if counted:
        attempt = sa.case((tasks.c.attempt > 0, tasks.c.attempt - 1), else_=0)
    return (
        sa.update(tasks)
        .where(tasks.c.id.in_(list(ids)), tasks.c.lease_token == token, tasks.c.state == RUNNING)
        .values(
            state=AVAILABLE,
            attempt=attempt,
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
    """Tasks newest first, optionally of one state and one task name; succeeded ones by the
    time they ended, newest first (read from the finished index: the newest ids are mostly
    tasks still waiting, which a walk back along the ids would pass one by one)."""
    order = [tasks.c.id.desc()]
    if state == SUCCEEDED:
        order = [tasks.c.finished_at.desc(), tasks.c.id.desc()]
    stmt = sa.select(tasks).order_by(*order).limit(limit)
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
    on the driver's rowcount, which sqlite3 does not give for a WITH; the next :p_since) and
    its id (whose attempt errors go in the same transaction)."""
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
    return sa.delete(tasks).where(doomed, old).returning(tasks.c.finished_at, tasks.c.id)


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


def clear_errors() -> sa.Delete:
    """Delete every recorded attempt error (test databases only)."""
    return sa.delete(task_errors)


def worker_gone(worker_id: str) -> sa.Delete:
    """A worker that stopped: its row goes."""
    return sa.delete(workers).where(workers.c.id == worker_id)


def worker_seen(worker_id: str, now: Any) -> sa.Update:
    """A live worker's periodic sign of life."""
    return sa.update(workers).where(workers.c.id == worker_id).values(seen_at=now)


def worker_started(worker_id: str, names: str, now: Any) -> sa.Insert:
    """A worker that starts, with the task names it leases (JSON)."""
    return sa.insert(workers).values(id=worker_id, names=names, started_at=now, seen_at=now)


def live_workers(since: Any) -> sa.Select[Any]:
    """The task names of the workers seen since `since`."""
    return sa.select(workers.c.names).where(workers.c.seen_at >= since)


def live_worker_ids(since: Any) -> sa.Select[Any]:
    """The ids of the workers seen since `since`, in order."""
    return sa.select(workers.c.id).where(workers.c.seen_at >= since).order_by(workers.c.id)


def due_waiting(before: Any) -> Any:
    """How many available tasks were due at or before `before`, and the oldest run_at."""
    oldest = sa.func.min(tasks.c.run_at)
    return sa.select(sa.func.count().label("n"), oldest.label("oldest")).where(
        tasks.c.state == AVAILABLE, tasks.c.run_at <= before
    )


def waiting_by_task() -> sa.Select[Any]:
    """How many tasks of each name are available (waiting for a worker)."""
    return (
        sa.select(tasks.c.task, sa.func.count())
        .where(tasks.c.state == AVAILABLE)
        .group_by(tasks.c.task)
    )


# -- the dashboard's reads: each bounded by an index and a LIMIT --------------------------


def task_filters(
    stmt: Any,
    *,
    state: str | None,
    queue: str | None,
    task: str | None,
    after: datetime | None,
    before: datetime | None,
) -> Any:
    """A task listing's filters, applied to a SELECT of oncely_tasks (or of its window)."""
    if state is not None:
        stmt = stmt.where(tasks.c.state == state)
    if queue is not None:
        stmt = stmt.where(tasks.c.queue == queue)
    if task is not None:
        stmt = stmt.where(tasks.c.task == task)
    if after is not None:
        stmt = stmt.where(tasks.c.created_at >= after)
    if before is not None:
        stmt = stmt.where(tasks.c.created_at < before)
    return stmt


def page_window(below: int | None, window: int) -> Any:
    """The ids of the `window` newest tasks below id `below`: one step of a bounded walk."""
    stmt = sa.select(tasks.c.id).order_by(tasks.c.id.desc()).limit(window)
    if below is not None:
        stmt = stmt.where(tasks.c.id < below)
    return stmt


def window_floor(window: Any) -> sa.Select[Any]:
    """The lowest id of a window and how many ids it holds."""
    ids = window.subquery()
    return sa.select(sa.func.min(ids.c.id), sa.func.count())


def page_between(
    floor: int | None, below: int | None, limit: int, **filters: Any
) -> sa.Select[Any]:
    """The tasks with ids in [floor, below) that pass the filters, newest first: a range of
    the id index, as long as one window at most."""
    stmt = sa.select(tasks)
    if floor is not None:
        stmt = stmt.where(tasks.c.id >= floor)
    if below is not None:
        stmt = stmt.where(tasks.c.id < below)
    filtered: sa.Select[Any] = task_filters(stmt, **filters)
    return filtered.order_by(tasks.c.id.desc()).limit(limit)


def failed_page(state: str, below: int | None, limit: int, **filters: Any) -> sa.Select[Any]:
    """Dead or discarded tasks newest first below id `below` (their own index)."""
    stmt = sa.select(tasks).where(tasks.c.state == state)
    if below is not None:
        stmt = stmt.where(tasks.c.id < below)
    filtered: sa.Select[Any] = task_filters(stmt, state=None, **filters)
    return filtered.order_by(tasks.c.id.desc()).limit(limit)


def keyed_page(
    names: Sequence[str], key: str, below: int | None, limit: int, **filters: Any
) -> sa.Select[Any]:
    """The tasks of these names with one idempotency key (the key index), newest first."""
    stmt = sa.select(tasks).where(tasks.c.task.in_(list(names)), tasks.c.idempotency_key == key)
    if below is not None:
        stmt = stmt.where(tasks.c.id < below)
    filtered: sa.Select[Any] = task_filters(stmt, **filters)
    return filtered.order_by(tasks.c.id.desc()).limit(limit)


def newest_id() -> sa.Select[Any]:
    """The highest task id (where a walk over the tasks starts)."""
    return sa.select(sa.func.max(tasks.c.id))


_STATE_INDEX = {
    # Each state with the predicate of an index that holds exactly its rows (or a part).
    AVAILABLE: (
        sa.and_(tasks.c.state == AVAILABLE, UNLIMITED),
        sa.and_(tasks.c.state == AVAILABLE, LIMITED),
    ),
    RUNNING: (tasks.c.state == RUNNING,),
    SUCCEEDED: (tasks.c.state == SUCCEEDED,),
    DISCARDED: (tasks.c.state == DISCARDED,),
    DEAD: (tasks.c.state == DEAD,),
}


def capped_counts(states: Sequence[str], cap: int) -> sa.Select[Any]:
    """How many tasks are in each of these states (one column each, in order), each count
    stopping at `cap` per index it reads: one round trip."""
    columns = []
    for state in states:
        parts = [
            sa.select(sa.func.count())
            .select_from(sa.select(tasks.c.id).where(where).limit(cap).subquery())
            .scalar_subquery()
            for where in _STATE_INDEX[state]
        ]
        total: Any = parts[0]
        for part in parts[1:]:
            total = total + part
        columns.append(total.label(state))
    return sa.select(*columns)


def live_by_queue(states: Sequence[str], cap: int) -> Any:
    """(state, queue, count) of at most `cap` tasks per index of each of these states (the
    available and running ones): one round trip."""
    counted = []
    for state in states:
        for where in _STATE_INDEX[state]:
            part = sa.select(tasks.c.queue).where(where).limit(cap).subquery()
            counted.append(
                sa.select(sa.literal(state).label("state"), part.c.queue, sa.func.count()).group_by(
                    part.c.queue
                )
            )
    return sa.union_all(*counted)


def finished_by_minute(minute: Any, state: str, since: Any, cap: int) -> sa.Select[Any]:
    """(minute, count) of the newest `cap` tasks that ended in `state` since `since`."""
    recent = (
        sa.select(tasks.c.finished_at)
        .where(tasks.c.state == state, tasks.c.finished_at >= since)
        .order_by(tasks.c.finished_at.desc())
        .limit(cap)
        .subquery()
    )
    bucket = minute(recent.c.finished_at).label("minute")
    return sa.select(bucket, sa.func.count()).group_by(bucket)
