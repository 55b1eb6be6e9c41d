"""A task that commits while another waits for a connection begins the waiter's transaction
in its COMMIT's message and hands the connection over (Postgres, asyncpg): one round trip
less per task when the pool is the bottleneck, and the waiter's work still commits with its
ack or not at all."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from queue_helpers import effects, in_tx  # type: ignore[import-not-found]

from oncely import Oncely, RetryPolicy, TaskState
from oncely.queue import discard_task, worker
from oncely.store import TaskPool
from oncely.work.tasks import TaskWorker

pytestmark = pytest.mark.postgres

INSERT = sa.text("INSERT INTO effects (n) VALUES (:n)")


class Messages:
    """The simple-query messages this process sends that begin a task's transaction."""

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()

    def kind(self, query: str) -> str | None:
        if "synchronous_commit TO on" not in query:
            return None
        return "with a COMMIT" if "; COMMIT" in query else "alone"


@pytest.fixture
def messages(monkeypatch: pytest.MonkeyPatch) -> Messages:
    seen = Messages()
    execute = asyncpg.Connection.execute

    async def counting(self: asyncpg.Connection, query: str, *args: Any, **kw: Any) -> Any:
        kind = seen.kind(query)
        if kind is not None:
            seen.seen[kind] += 1
        return await execute(self, query, *args, **kw)

    monkeypatch.setattr(asyncpg.Connection, "execute", counting)
    return seen


async def until(check: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    for _ in range(1500):  # 30 s
        got = check()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within 30 s: {what}")


@asynccontextmanager
async def consuming(app: Oncely, **options: Any) -> AsyncIterator[TaskWorker]:
    w = worker(app, **options)
    stopping = asyncio.Event()
    task = asyncio.create_task(w.consume(stopping))
    try:
        yield w
    finally:
        stopping.set()
        await asyncio.wait_for(task, 30)


async def run_one_connection(
    app: Oncely,
    concurrency: int,
    pools: list[TaskPool],
    done: Callable[[], Awaitable[bool]],
    what: str,
) -> None:
    """A worker with a pool of one connection until `done()`; its pool in `pools` meanwhile."""
    async with consuming(app, concurrency=concurrency, pool_size=1, poll=0.05) as w:
        await until(lambda: w.conns.pool is not None, "the pool")
        assert w.conns.pool is not None
        pools.append(w.conns.pool)
        await until(done, what)


async def states(app: Oncely, ids: list[int]) -> list[TaskState]:
    return [(await app.task_record(i)).state for i in ids]


async def test_tasks_waiting_for_the_one_connection_begin_in_the_previous_commit(
    pg_app: Oncely, messages: Messages
) -> None:
    @pg_app.task
    async def write(db, n: int) -> None:  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    recs = await in_tx(pg_app, lambda db: write.enqueue_many(db, [{"n": n} for n in range(5)]))
    ids = [r.id for r in recs]
    async with consuming(pg_app, concurrency=5, pool_size=1, poll=0.05) as w:
        await until(lambda: _all_succeeded(pg_app, ids), "five tasks")
        assert w.conns.pool is not None and w.conns.pool.peak == 1
    assert await effects(pg_app) == [0, 1, 2, 3, 4]
    # The first task began its own transaction; each of the others waited for the one
    # connection and found its transaction begun by the COMMIT before it.
    assert messages.seen == {"alone": 1, "with a COMMIT": 4}, messages.seen


async def _all_succeeded(app: Oncely, ids: list[int]) -> bool:
    return all(s is TaskState.SUCCEEDED for s in await states(app, ids))


async def test_a_task_handed_a_begun_transaction_that_fails_leaves_nothing(
    pg_app: Oncely, messages: Messages
) -> None:
    """Task 1 holds the only connection until tasks 2 and 3 wait for it; its COMMIT begins
    task 2's transaction. Task 2 inserts, then raises: its row must roll back (had its
    transaction not been begun, the insert would have committed on its own)."""
    pools: list[TaskPool] = []

    @pg_app.task(retry=RetryPolicy(attempts=1))
    async def write(db, n: int) -> None:  # type: ignore[no-untyped-def]
        if n != 1:
            await until(lambda: bool(pools) and pools[0].lent == 1, "task 1 to hold it")
        await db.execute(INSERT, {"n": n})
        if n == 1:
            await until(lambda: pools[0].in_line == 2, "tasks 2 and 3 in line")
        if n == 2:
            raise RuntimeError("after its insert")

    recs = await in_tx(pg_app, lambda db: write.enqueue_many(db, [{"n": n} for n in (1, 2, 3)]))
    ids = [r.id for r in recs]
    await run_one_connection(
        pg_app, 3, pools, lambda: _ended(pg_app, ids), "the three tasks to end"
    )
    assert await states(pg_app, ids) == [TaskState.SUCCEEDED, TaskState.DEAD, TaskState.SUCCEEDED]
    assert await effects(pg_app) == [1, 3]
    # Task 2's transaction came with task 1's COMMIT; it rolled back, so task 3 began its own.
    assert messages.seen["with a COMMIT"] >= 1, messages.seen


async def _ended(app: Oncely, ids: list[int]) -> bool:
    return all(s in (TaskState.SUCCEEDED, TaskState.DEAD) for s in await states(app, ids))


async def test_a_lost_lease_hands_over_nothing_and_the_waiter_begins_its_own(
    pg_app: Oncely, messages: Messages
) -> None:
    """Task 1's lease is lost (an operator discards it) while task 2 waits for the one
    connection: task 1's ack fails before its COMMIT, so no transaction is begun for task 2,
    which begins its own and commits."""
    pools: list[TaskPool] = []

    @pg_app.task
    async def write(db, n: int) -> None:  # type: ignore[no-untyped-def]
        if n == 2:
            await until(lambda: bool(pools) and pools[0].lent == 1, "task 1 to hold it")
        await db.execute(INSERT, {"n": n})
        if n == 1:
            await until(lambda: pools[0].in_line == 1, "task 2 in line")
            await discard_task(pg_app, ids[0])

    recs = await in_tx(pg_app, lambda db: write.enqueue_many(db, [{"n": n} for n in (1, 2)]))
    ids = [r.id for r in recs]
    await run_one_connection(pg_app, 2, pools, lambda: _done(pg_app, ids), "task 2 to succeed")
    assert await states(pg_app, ids) == [TaskState.DISCARDED, TaskState.SUCCEEDED]
    assert await effects(pg_app) == [2]
    # Task 1's ack went with a BEGIN for task 2 after its COMMIT; the failed ack stopped the
    # message there (nothing after it ran), so task 2 began a transaction of its own.
    assert messages.seen == {"with a COMMIT": 1, "alone": 2}, messages.seen


async def _done(app: Oncely, ids: list[int]) -> bool:
    return await states(app, ids) == [TaskState.DISCARDED, TaskState.SUCCEEDED]


async def test_a_waiter_cancelled_as_it_is_handed_a_connection_passes_it_on(
    pg_app: Oncely,
) -> None:
    """The pool alone: a connection handed to the first task in line, which is cancelled
    before it runs, goes to the next one in line; with no one left, it is closed and its
    place freed."""
    store = pg_app.store
    pool = TaskPool(store.dialect.task_engine(store.engine), 1, store.dialect.task_connection_ok)
    try:
        conn, begun = await pool.take()
        assert (begun, pool.lent) == (False, 1)
        first = asyncio.create_task(pool.take())
        second = asyncio.create_task(pool.take())
        await until(lambda: pool.in_line == 2, "two tasks in line")
        assert pool.hand_off(conn)
        first.cancel()  # after it was handed the connection, before it ran
        got, begun = await second
        assert first.cancelled()
        assert (got is conn, begun, pool.lent, pool.in_line) == (True, True, 1, 0)
        third = asyncio.create_task(pool.take())
        await until(lambda: pool.in_line == 1, "a third task in line")
        assert pool.hand_off(got)
        third.cancel()  # no one else in line: closed, its place given back
        with pytest.raises(asyncio.CancelledError):
            await third
        await until(lambda: conn.closed, "the connection closed")
        assert (pool.lent, pool.in_line) == (0, 0)
        fresh, begun = await pool.take()  # a new one, not begun
        assert (fresh is not conn, begun, pool.lent) == (True, False, 1)
        await pool.give(fresh)
        assert pool.lent == 0
    finally:
        await pool.close()
