"""The task store's contract: every operation the task worker uses, on SQLite and Postgres.

One suite over both databases (the `db_url` fixture), in the manner of a driver conformance
suite: each test puts rows in, calls one store operation, and reads the rows back with a plain
SELECT on oncely's `tasks` table. The calls into the store sit in the small functions under
"the store's operations" below, so a change of a method's name or shape is one line there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from oncely.model import TaskState
from oncely.schema import tasks
from oncely.store import Store, TaskPool
from oncely.store.task_queue import Leased, Settle, enqueue

LONG = 600.0  # seconds: a lease that does not run out during a test
BY = "contract-worker"


# -- the store's operations (one call each) -------------------------------------------------


async def put(
    store: Store, task: str = "t", *, queue: str = "default", delay: float = 0.0, **args: Any
) -> int:
    """Enqueue one task in a transaction of its own; its id."""
    entry = {"task": task, "queue": queue, "args": args, "delay": delay}
    async with AsyncSession(store.engine) as db, db.begin():
        [rec] = await enqueue(db, [entry])
    return rec.id


async def fetch(
    store: Store,
    token: str,
    *,
    limit: int = 10,
    queues: list[str] | None = None,
    lease: float = LONG,
    conn: AsyncConnection | None = None,
) -> list[Leased]:
    """Lease up to `limit` due tasks for `token`, committed."""
    if conn is not None:
        return await store.tasks.fetch(conn, queues, limit, token, BY, lease)
    async with store.engine.connect() as own:
        return await store.tasks.fetch(own, queues, limit, token, BY, lease)


async def lease_in(
    store: Store, conn: AsyncConnection, token: str, *, limit: int = 10
) -> list[Leased]:
    """Lease in `conn`'s open transaction (not committed: the rows stay locked)."""
    return await store.tasks.lease(conn, None, limit, token, BY, LONG)


async def ack(store: Store, leased: list[Leased]) -> set[int]:
    """Mark leased tasks succeeded iff their lease is still theirs; the ids that were."""
    return await store.tasks.settle([Settle(item, TaskState.SUCCEEDED) for item in leased])


async def record(
    store: Store, item: Leased, state: TaskState, wait: float | None, error: str
) -> bool:
    """Record an attempt's retry (in `wait` seconds) or end; False if the lease was not ours."""
    return bool(await store.tasks.settle([Settle(item, state, wait, error)]))


async def heartbeat(store: Store, leased: list[Leased], lease: float = LONG) -> set[int]:
    return await store.tasks.heartbeat(leased, lease)


async def rescue(store: Store) -> list[Any]:
    return await store.tasks.rescue()


async def hand_back(store: Store, leased: list[Leased], *, started: bool) -> None:
    await store.tasks.hand_back_unstarted(leased, started=started)


async def discard(store: Store, task_id: int) -> Any:
    return await store.tasks.discard(task_id)


async def retry_now(store: Store, task_id: int) -> Any:
    return await store.tasks.retry_now(task_id)


async def prune(store: Store, before: datetime) -> tuple[int, int]:
    return await store.tasks.prune(before)


# -- reading the rows -----------------------------------------------------------------------


async def row(store: Store, task_id: int) -> Any:
    """The task's row as it is in the database."""
    async with store.engine.connect() as conn:
        found = (await conn.execute(sa.select(tasks).where(tasks.c.id == task_id))).one()
        await conn.rollback()
    return found


async def ids(store: Store) -> list[int]:
    async with store.engine.connect() as conn:
        found = [r.id for r in await conn.execute(sa.select(tasks.c.id).order_by(tasks.c.id))]
        await conn.rollback()
    return found


async def now(store: Store) -> datetime:
    """The clock leases are measured on (Postgres' own; this host's for SQLite)."""
    return await store.database_time()


def leased_as(item: Leased, token: str) -> Leased:
    """The same task as another worker's token would name it."""
    return Leased(item.id, item.task, item.args, item.attempt, item.queue, token)


# -- lease / fetch ----------------------------------------------------------------------------


async def test_fetch_leases_due_tasks_only_oldest_first_and_counts_the_attempt(
    store: Store,
) -> None:
    first = await put(store, n=1)
    later = await put(store, delay=3600, n=2)
    second = await put(store, n=3)
    before = await now(store)
    leased = await fetch(store, "tok-a", lease=LONG)
    after = await now(store)

    assert [(t.id, t.attempt, t.token, t.args) for t in leased] == [
        (first, 1, "tok-a", {"n": 1}),
        (second, 1, "tok-a", {"n": 3}),
    ]
    for task_id in (first, second):
        r = await row(store, task_id)
        assert (r.state, r.attempt, r.lease_token, r.locked_by) == ("running", 1, "tok-a", BY)
        assert before <= r.started_at <= after
        assert before + timedelta(seconds=LONG) <= r.lease_expires_at
        assert r.lease_expires_at <= after + timedelta(seconds=LONG)
    r = await row(store, later)
    assert (r.state, r.attempt, r.lease_token, r.started_at) == ("available", 0, None, None)


async def test_fetch_takes_at_most_limit_and_never_a_task_already_leased(store: Store) -> None:
    made = [await put(store, n=i) for i in range(3)]
    assert [t.id for t in await fetch(store, "tok-a", limit=2)] == made[:2]
    assert [t.id for t in await fetch(store, "tok-b", limit=2)] == made[2:]
    assert await fetch(store, "tok-c") == []
    assert [(await row(store, i)).lease_token for i in made] == ["tok-a", "tok-a", "tok-b"]
    assert [(await row(store, i)).attempt for i in made] == [1, 1, 1]


async def test_fetch_leases_only_the_queues_asked_for(store: Store) -> None:
    a = await put(store, queue="a")
    b = await put(store, queue="b")
    c = await put(store, queue="c")
    assert [t.id for t in await fetch(store, "tok-1", queues=["a", "c"])] == [a, c]
    assert (await row(store, b)).state == "available"
    assert await fetch(store, "tok-2", queues=["a", "c"]) == []
    assert [(t.id, t.queue) for t in await fetch(store, "tok-3", queues=None)] == [(b, "b")]


async def test_two_connections_fetching_at_once_never_lease_a_task_twice(store: Store) -> None:
    made = [await put(store, n=i) for i in range(30)]

    async def drain(token: str) -> list[int]:
        got: list[int] = []
        async with store.engine.connect() as conn:
            while leased := await fetch(store, token, limit=3, conn=conn):
                got += [t.id for t in leased]
        return got

    a, b = await asyncio.gather(drain("tok-a"), drain("tok-b"))
    assert not set(a) & set(b)
    assert sorted(a + b) == made
    for task_id in made:
        r = await row(store, task_id)
        assert (r.state, r.attempt) == ("running", 1)
        assert r.lease_token == ("tok-a" if task_id in a else "tok-b")


async def test_fetch_skips_rows_another_transaction_is_leasing_without_waiting(
    pg_store: Store,
) -> None:
    """Postgres: a fetch passes over the rows an open transaction holds (SKIP LOCKED) instead of
    waiting for it to end. SQLite has one writer at a time: its race is the test above."""
    made = [await put(pg_store, n=i) for i in range(4)]
    async with pg_store.engine.connect() as holder:
        async with holder.begin():
            held = await lease_in(pg_store, holder, "tok-holder", limit=2)
            assert [t.id for t in held] == made[:2]
            other = await asyncio.wait_for(fetch(pg_store, "tok-other"), timeout=10)
            assert [t.id for t in other] == made[2:]
        assert await fetch(pg_store, "tok-late") == []
    assert [(await row(pg_store, i)).lease_token for i in made] == [
        "tok-holder",
        "tok-holder",
        "tok-other",
        "tok-other",
    ]


# -- ack: compare-and-set on (id, lease token) ------------------------------------------------


async def test_ack_with_the_lease_token_marks_succeeded(store: Store) -> None:
    task_id = await put(store)
    [item] = await fetch(store, "tok-a")
    before = await now(store)
    assert await ack(store, [item]) == {task_id}
    after = await now(store)
    r = await row(store, task_id)
    assert (r.state, r.attempt, r.lease_expires_at) == ("succeeded", 1, None)
    assert before <= r.finished_at <= after
    assert await ack(store, [item]) == set()  # acked once: a second ack changes nothing


async def test_ack_with_a_wrong_token_changes_nothing(store: Store) -> None:
    task_id = await put(store)
    [item] = await fetch(store, "tok-a")
    assert await ack(store, [leased_as(item, "tok-wrong")]) == set()
    r = await row(store, task_id)
    assert (r.state, r.lease_token, r.finished_at) == ("running", "tok-a", None)


async def test_ack_with_a_stale_token_changes_nothing_after_the_task_was_leased_again(
    store: Store,
) -> None:
    task_id = await put(store)
    [stale] = await fetch(store, "tok-old", lease=-1)  # a lease that has run out
    assert [r.id for r in await rescue(store)] == [task_id]
    [fresh] = await fetch(store, "tok-new")
    assert await ack(store, [stale]) == set()
    r = await row(store, task_id)
    assert (r.state, r.lease_token, r.attempt) == ("running", "tok-new", 2)
    assert await ack(store, [fresh]) == {task_id}
    assert (await row(store, task_id)).state == "succeeded"


async def test_ack_of_several_tokens_acks_exactly_the_held_ones(store: Store) -> None:
    made = [await put(store, n=i) for i in range(4)]
    mine = await fetch(store, "tok-a", limit=2)
    theirs = await fetch(store, "tok-b", limit=2)
    claimed = [*mine, leased_as(theirs[0], "tok-a"), theirs[1]]
    assert await ack(store, claimed) == {made[0], made[1], made[3]}
    states = [(await row(store, i)).state for i in made]
    assert states == ["succeeded", "succeeded", "running", "succeeded"]


# -- the record of an attempt that failed -----------------------------------------------------


async def test_a_retry_is_recorded_available_later_with_its_error_and_attempt(
    store: Store,
) -> None:
    task_id = await put(store)
    [item] = await fetch(store, "tok-a")
    before = await now(store)
    assert await record(store, item, TaskState.AVAILABLE, 60, "Boom: the gateway timed out")
    after = await now(store)
    r = await row(store, task_id)
    assert (r.state, r.attempt, r.error) == ("available", 1, "Boom: the gateway timed out")
    assert (r.lease_token, r.lease_expires_at, r.finished_at) == (None, None, None)
    assert before + timedelta(seconds=60) <= r.run_at <= after + timedelta(seconds=60)
    assert await fetch(store, "tok-b") == []  # not due before its wait is over


@pytest.mark.parametrize("state", [TaskState.DEAD, TaskState.DISCARDED])
async def test_an_end_is_recorded_finished_with_its_error(store: Store, state: TaskState) -> None:
    task_id = await put(store)
    [item] = await fetch(store, "tok-a")
    before = await now(store)
    assert await record(store, item, state, None, "OrderGone: order 42")
    after = await now(store)
    r = await row(store, task_id)
    assert (r.state, r.attempt, r.error, r.lease_expires_at) == (
        state.value,
        1,
        "OrderGone: order 42",
        None,
    )
    assert before <= r.finished_at <= after
    assert await fetch(store, "tok-b") == []


async def test_an_outcome_with_a_token_that_is_not_the_lease_records_nothing(
    store: Store,
) -> None:
    task_id = await put(store)
    [item] = await fetch(store, "tok-a")
    assert not await record(store, leased_as(item, "tok-wrong"), TaskState.DEAD, None, "E: x")
    assert not await record(store, leased_as(item, "tok-wrong"), TaskState.AVAILABLE, 1, "E: x")
    r = await row(store, task_id)
    assert (r.state, r.lease_token, r.error, r.finished_at) == ("running", "tok-a", None, None)


# -- discard and retry now (the operator's) ---------------------------------------------------


async def test_discard_ends_a_waiting_or_running_task_and_its_running_attempt_cannot_ack(
    store: Store,
) -> None:
    waiting = await put(store, delay=3600)
    running = await put(store)
    [item] = await fetch(store, "tok-a")
    for task_id in (waiting, running):
        rec = await discard(store, task_id)
        assert (rec.id, rec.state) == (task_id, TaskState.DISCARDED)
        r = await row(store, task_id)
        assert (r.state, r.lease_token, r.lease_expires_at) == ("discarded", None, None)
        assert r.finished_at is not None
    assert await ack(store, [item]) == set()
    assert (await row(store, running)).state == "discarded"


async def test_discard_leaves_a_succeeded_task_alone(store: Store) -> None:
    task_id = await put(store)
    await ack(store, await fetch(store, "tok-a"))
    assert await discard(store, task_id) is None
    assert (await row(store, task_id)).state == "succeeded"


async def test_retry_now_makes_a_dead_task_due_with_fresh_attempts_but_not_a_succeeded_one(
    store: Store,
) -> None:
    dead = await put(store, n=1)
    [item] = await fetch(store, "tok-a")
    assert await record(store, item, TaskState.DEAD, None, "E: gave up")
    done = await put(store, n=2)
    await ack(store, await fetch(store, "tok-b"))

    rec = await retry_now(store, dead)
    assert (rec.id, rec.state, rec.attempt) == (dead, TaskState.AVAILABLE, 0)
    assert await retry_now(store, done) is None
    assert (await row(store, done)).state == "succeeded"
    assert [(t.id, t.attempt) for t in await fetch(store, "tok-c")] == [(dead, 1)]


# -- heartbeat --------------------------------------------------------------------------------


async def test_heartbeat_extends_only_the_leases_still_held(store: Store) -> None:
    kept = await put(store, n=1)
    lost = await put(store, n=2)
    leased = await fetch(store, "tok-a", lease=30)
    await discard(store, lost)  # no longer ours
    lost_row = await row(store, lost)
    before = await now(store)
    assert await heartbeat(store, leased, lease=LONG) == {kept}
    r = await row(store, kept)
    assert r.lease_expires_at >= before + timedelta(seconds=LONG)
    assert (r.state, r.lease_token) == ("running", "tok-a")
    assert await row(store, lost) == lost_row
    assert await heartbeat(store, [leased_as(leased[0], "tok-wrong")]) == set()
    assert await heartbeat(store, []) == set()


async def test_heartbeat_does_not_extend_a_lease_another_worker_holds_now(store: Store) -> None:
    task_id = await put(store)
    [stale] = await fetch(store, "tok-old", lease=-1)
    await rescue(store)
    [_fresh] = await fetch(store, "tok-new", lease=30)
    theirs = await row(store, task_id)
    assert await heartbeat(store, [stale]) == set()
    assert await row(store, task_id) == theirs


# -- rescue -----------------------------------------------------------------------------------


async def test_rescue_makes_expired_leases_available_and_keeps_the_attempt(store: Store) -> None:
    expired = await put(store, n=1)
    [_item] = await fetch(store, "tok-dead", lease=-1)  # its worker stopped renewing it
    alive = await put(store, n=2)
    [_live] = await fetch(store, "tok-alive", lease=LONG)
    before = await now(store)

    rescued = await rescue(store)
    assert [(r.id, r.task, r.attempt, r.locked_by) for r in rescued] == [(expired, "t", 1, BY)]
    r = await row(store, expired)
    assert (r.state, r.attempt, r.lease_token, r.lease_expires_at) == ("available", 1, None, None)
    assert r.run_at >= before
    assert r.error.startswith("LeaseExpired")
    assert (await row(store, alive)).state == "running"
    assert await rescue(store) == []
    assert [(t.id, t.attempt) for t in await fetch(store, "tok-next")] == [(expired, 2)]


# -- prune ------------------------------------------------------------------------------------


async def test_prune_deletes_finished_tasks_before_the_cutoff_only(store: Store) -> None:
    succeeded = await put(store, n=1)
    await ack(store, await fetch(store, "tok-1"))
    dead = await put(store, n=2)
    [item] = await fetch(store, "tok-2")
    await record(store, item, TaskState.DEAD, None, "E: x")
    discarded = await put(store, n=3)
    await discard(store, discarded)
    running = await put(store, n=4)
    await fetch(store, "tok-4")
    waiting = await put(store, n=5, delay=3600)
    retrying = await put(store, n=6)
    [item] = await fetch(store, "tok-6")
    await record(store, item, TaskState.AVAILABLE, 3600, "E: later")
    finished_by = await now(store)

    assert await prune(store, finished_by - timedelta(hours=1)) == (0, 0)
    assert await ids(store) == [succeeded, dead, discarded, running, waiting, retrying]
    assert await prune(store, finished_by + timedelta(seconds=1)) == (3, 0)
    assert await ids(store) == [running, waiting, retrying]


async def test_prune_deletes_in_batches_each_committed_on_its_own(store: Store) -> None:
    """A prune of many rows is many short transactions (workers never wait behind one long
    DELETE): with batches of 2, five succeeded tasks and three old claims take 3 + 2 batches
    (and one empty batch for each finished state and for the claims to find the end: 9),
    each committed by itself."""
    from oncely.schema import runs

    made = [await put(store, n=i) for i in range(6)]
    await ack(store, await fetch(store, "tok-p", limit=5))
    finished_by = await now(store)
    old = finished_by - timedelta(days=2)
    async with store.engine.begin() as conn:
        for key in ("a", "b", "c", "d"):
            claimed_at = old if key != "d" else finished_by + timedelta(days=1)
            await conn.execute(
                sa.insert(runs).values(job="j", key=key, claimed_at=claimed_at, claimed_by=BY)
            )
    deletes: list[str] = []
    commits: list[int] = []
    errors_at: list[tuple[int, int]] = []  # (batch deletes, commits) at each errors' delete

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "DELETE FROM ONCELY_TASK_ERRORS" in statement.upper():
            errors_at.append((len(deletes), len(commits)))
        elif "DELETE FROM" in statement.upper():
            deletes.append(statement)

    sync = store.engine.sync_engine
    sa.event.listen(sync, "before_cursor_execute", seen)
    sa.event.listen(sync, "commit", lambda _conn: commits.append(len(deletes)))
    try:
        assert await store.tasks.prune(finished_by + timedelta(seconds=1), batch=2) == (5, 3)
    finally:
        sa.event.remove(sync, "before_cursor_execute", seen)
    assert len(deletes) == 9
    assert commits == list(range(1, 10))  # one commit after each DELETE
    # Each batch of tasks deleted takes their attempt errors along, before its commit.
    assert errors_at == [(1, 0), (2, 1), (3, 2)]
    assert await ids(store) == made[5:]
    async with store.engine.connect() as conn:
        left = [r.key for r in await conn.execute(sa.select(runs.c.key))]
    assert left == ["d"]


# -- leases handed back -----------------------------------------------------------------------


async def test_hand_back_of_unstarted_leases_without_counting_the_attempt(
    store: Store,
) -> None:
    made = [await put(store, n=i) for i in range(2)]
    leased = await fetch(store, "tok-a")
    before = await now(store)
    await hand_back(store, leased, started=False)
    for task_id in made:
        r = await row(store, task_id)
        assert (r.state, r.attempt, r.lease_token, r.locked_by, r.lease_expires_at) == (
            "available",
            0,
            None,
            None,
            None,
        )
        assert r.run_at >= before
    assert [(t.id, t.attempt) for t in await fetch(store, "tok-b")] == [(i, 1) for i in made]


async def test_hand_back_of_started_leases_keeps_the_attempt(store: Store) -> None:
    task_id = await put(store)
    leased = await fetch(store, "tok-a")
    await hand_back(store, leased, started=True)
    r = await row(store, task_id)
    assert (r.state, r.attempt, r.lease_token) == ("available", 1, None)
    assert [(t.id, t.attempt) for t in await fetch(store, "tok-b")] == [(task_id, 2)]


async def test_hand_back_does_not_touch_a_lease_another_worker_holds(store: Store) -> None:
    task_id = await put(store)
    [stale] = await fetch(store, "tok-old", lease=-1)
    await rescue(store)
    await fetch(store, "tok-new")
    theirs = await row(store, task_id)
    await hand_back(store, [stale], started=False)
    assert await row(store, task_id) == theirs


# -- a task's own transaction ---------------------------------------------------------------

WORKER_TOKEN = "c0ffee.1"  # a worker's lease token has this shape (see TaskWorker.token)


@pytest.fixture
async def pool(store: Store) -> AsyncIterator[TaskPool]:
    """A worker's pool of two connections for tasks' transactions, and an effects table."""
    async with store.engine.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE contract_effects (n integer)"))
    lent = TaskPool(store.dialect.task_engine(store.engine), 2, store.dialect.task_connection_ok)
    yield lent
    await lent.close()


async def effects_of(store: Store) -> list[int]:
    async with store.engine.connect() as conn:
        rows = await conn.execute(sa.text("SELECT n FROM contract_effects ORDER BY n"))
        return [r[0] for r in rows]


async def run_task(store: Store, pool: TaskPool, item: Leased, n: int | None) -> bool | None:
    """One task's transaction: insert `n` (or make no statement), then commit with the ack."""
    tx = store.tasks.transaction(pool, item)
    try:
        if n is not None:
            await tx.session.execute(sa.text("INSERT INTO contract_effects VALUES (:n)"), {"n": n})
        return await tx.commit()
    finally:
        await tx.close()


async def test_a_task_transaction_commits_its_work_with_its_ack(
    store: Store, pool: TaskPool
) -> None:
    task_id = await put(store)
    [item] = await fetch(store, WORKER_TOKEN)
    assert await run_task(store, pool, item, 7) is True
    assert (await row(store, task_id)).state == "succeeded"
    assert await effects_of(store) == [7]
    assert pool.lent == 0 and pool.peak == 1


async def test_a_task_transaction_whose_lease_was_lost_commits_nothing(
    store: Store, pool: TaskPool
) -> None:
    task_id = await put(store)
    [item] = await fetch(store, WORKER_TOKEN)
    assert await discard(store, task_id) is not None  # an operator, meanwhile
    assert await run_task(store, pool, item, 7) is False
    assert (await row(store, task_id)).state == "discarded"
    assert await effects_of(store) == []
    assert pool.lent == 0


async def test_a_task_transaction_without_a_statement_takes_no_connection(
    store: Store, pool: TaskPool
) -> None:
    task_id = await put(store)
    [item] = await fetch(store, WORKER_TOKEN)
    assert await run_task(store, pool, item, None) is None  # its ack is the worker's to write
    assert pool.peak == 0
    assert (await row(store, task_id)).state == "running"
    assert await ack(store, [item]) == {task_id}


async def test_hand_back_of_tasks_that_never_ran_does_not_count_their_attempt(
    store: Store,
) -> None:
    task_id = await put(store)
    leased = await fetch(store, "tok-a")
    await store.tasks.hand_back_unstarted(leased, started=False)
    r = await row(store, task_id)
    assert (r.state, r.attempt, r.lease_token) == ("available", 0, None)


# -- an attempt counts when its body starts ---------------------------------------------------


async def test_a_lease_counts_the_attempts_of_the_first_start_tasks_only(store: Store) -> None:
    made = [await put(store, n=i) for i in range(3)]
    async with store.engine.connect() as conn:
        leased = await store.tasks.fetch(conn, None, 10, "tok-a", BY, LONG, None, 1)
    assert [(t.id, t.attempt, t.counted) for t in leased] == [
        (made[0], 1, True),
        (made[1], 0, False),
        (made[2], 0, False),
    ]
    rows = [await row(store, task_id) for task_id in made]
    assert [(r.state, r.attempt) for r in rows] == [("running", 1), ("running", 0), ("running", 0)]
    assert rows[0].started_at is not None and rows[1].started_at is None


async def test_begin_attempts_counts_a_leased_ahead_task_iff_its_lease_is_still_ours(
    store: Store,
) -> None:
    made = [await put(store, n=i) for i in range(2)]
    async with store.engine.connect() as conn:
        leased = await store.tasks.fetch(conn, None, 10, "tok-a", BY, LONG, None, 0)
    assert [t.attempt for t in leased] == [0, 0]
    stolen = leased_as(leased[1], "tok-other")
    counted = await store.tasks.begin_attempts([leased[0], stolen], store.engine)
    assert counted == {made[0]: 1}
    assert [(await row(store, i)).attempt for i in made] == [1, 0]
    assert (await row(store, made[0])).started_at is not None


async def test_hand_back_and_rescue_of_a_leased_ahead_task_leave_its_attempt_uncounted(
    store: Store,
) -> None:
    made = [await put(store, n=i) for i in range(2)]
    async with store.engine.connect() as conn:
        leased = await store.tasks.fetch(conn, None, 10, "tok-a", BY, 0.05, None, 0)
    await hand_back(store, leased[:1], started=False)
    assert (await row(store, made[0])).attempt == 0
    deadline = asyncio.get_running_loop().time() + 10
    while not await rescue(store):  # the other lease runs out: a worker that died
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
    assert [((r := await row(store, i)).state, r.attempt) for i in made] == [
        ("available", 0),
        ("available", 0),
    ]


async def test_hand_back_unrunnable_is_due_later_uncounted_with_its_reason(store: Store) -> None:
    made = [await put(store, n=i) for i in range(2)]
    async with store.engine.connect() as conn:
        leased = await store.tasks.fetch(conn, None, 10, "tok-a", BY, LONG, None, 1)
    before = await now(store)
    done = await store.tasks.hand_back_unrunnable(leased, 30.0, "Unrunnable: why", store.engine)
    assert done == set(made)
    for task_id in made:
        r = await row(store, task_id)
        assert (r.state, r.attempt, r.lease_token, r.error) == (
            "available",
            0,
            None,
            "Unrunnable: why",
        )
        assert r.run_at >= before + timedelta(seconds=29)
