"""The lease's limits and order, and the ack's result: store operations on SQLite and Postgres.

Rows go in with `enqueue` (carrying the limits a task registers), one store operation runs,
and the rows are read back with plain SELECTs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from tests.store.test_task_queue import fetch, heartbeat, lease_in, now, row

from oncely.schema import tasks
from oncely.store import Store
from oncely.store.task_queue import Leased, enqueue


async def put(store: Store, task: str = "t", **limits: Any) -> int:
    """Enqueue one task whose row carries `limits` (priority, concurrency, concurrency_key,
    rate, rate_period, rate_key); its id."""
    entry = {"task": task, "queue": "default", "args": {}, **limits}
    async with AsyncSession(store.engine) as db, db.begin():
        [rec] = await enqueue(db, [entry])
    return rec.id


async def ack(
    store: Store, leased: list[Leased], results: dict[int, str] | None = None
) -> set[int]:
    async with store.engine.begin() as conn:
        return await store.tasks.ack(conn, leased, results)


async def states(store: Store) -> dict[int, tuple[str, int]]:
    async with store.engine.connect() as conn:
        rows = await conn.execute(sa.select(tasks.c.id, tasks.c.state, tasks.c.attempt))
        return {r.id: (r.state, r.attempt) for r in rows}


async def until(check: Callable[[], Awaitable[bool]], limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def conc(key: str, n: int = 1) -> dict[str, Any]:
    return {"concurrency": n, "concurrency_key": key}


async def test_a_lease_takes_the_highest_priority_first_then_the_oldest(store: Store) -> None:
    made = [await put(store, priority=p) for p in (0, 5, -1, 5, 10, 0)]
    leased = await fetch(store, "tok", limit=4)
    assert [t.id for t in leased] == [made[4], made[1], made[3], made[0]]
    assert [t.id for t in await fetch(store, "tok2")] == [made[5], made[2]]


async def test_a_lease_gives_each_concurrency_group_at_most_its_limit_the_rest_wait_uncounted(
    store: Store,
) -> None:
    a = [await put(store, **conc("a", 2)) for _ in range(5)]
    b = [await put(store, **conc("b", 2)) for _ in range(3)]
    free = [await put(store) for _ in range(2)]
    other_task = await put(store, "u", **conc("a", 2))  # a group is per task name
    leased = {t.id for t in await fetch(store, "tok", limit=20)}
    assert leased == {*a[:2], *b[:2], *free, other_task}
    rows = await states(store)
    assert all(rows[i] == ("available", 0) for i in (*a[2:], b[2]))
    assert await fetch(store, "tok2", limit=20) == []
    # A slot frees when its holder acks: exactly one more of group a.
    first = next(t for t in await fetch_all(store) if t.id == a[0])
    assert await ack(store, [first]) == {a[0]}
    assert [t.id for t in await fetch(store, "tok3", limit=20)] == [a[2]]


async def fetch_all(store: Store) -> list[Leased]:
    """The running tasks as their holders name them (for acking them)."""
    async with store.engine.connect() as conn:
        rows = await conn.execute(sa.select(tasks).where(tasks.c.state == "running"))
        return [Leased(r.id, r.task, r.args, r.attempt, r.queue, r.lease_token) for r in rows]


async def test_a_global_limit_holds_whatever_the_arguments(store: Store) -> None:
    made = [await put(store, concurrency=3, concurrency_key="") for _ in range(5)]
    assert {t.id for t in await fetch(store, "tok", limit=10)} == set(made[:3])
    assert await fetch(store, "tok2", limit=10) == []


async def test_limits_enqueued_many_at_once_keep_their_groups(store: Store) -> None:
    """One INSERT of many rows (Postgres: one array per column) keeps each row's limits,
    the task's own group ("") included."""
    one = {"task": "g", "queue": "default", "args": {}, "concurrency": 2, "concurrency_key": ""}
    rated = {"task": "r", "queue": "default", "args": {}, "rate": 1, "rate_period": 60.0}
    rated["rate_key"] = ""
    async with AsyncSession(store.engine) as db, db.begin():
        await enqueue(db, [one] * 4 + [rated] * 3)
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            sa.select(tasks.c.task, tasks.c.concurrency_key, tasks.c.rate_key)
        )
        assert sorted(tuple(r) for r in rows) == [("g", "", None)] * 4 + [("r", None, "")] * 3
    assert sorted(t.task for t in await fetch(store, "tok", limit=10)) == ["g", "g", "r"]


async def test_an_expired_lease_frees_its_groups_slot_before_any_rescue_and_cannot_come_back(
    store: Store,
) -> None:
    first, second = await put(store, **conc("a")), await put(store, **conc("a"))
    [held] = await fetch(store, "dead-holder", lease=0.5)
    assert held.id == first
    assert await fetch(store, "tok2") == []
    expires = (await row(store, first)).lease_expires_at
    await until(lambda: _past(store, expires))
    [taken] = await fetch(store, "tok3")
    assert taken.id == second
    assert (await row(store, first)).state == "running"  # not rescued: the lease alone decides
    # The dead holder's lease is not renewed, nor can its attempt ack (the slot is another's).
    assert await heartbeat(store, [held]) == set()
    assert await ack(store, [held]) == set()
    assert (await row(store, first)).state == "running"


async def _past(store: Store, at: Any) -> bool:
    return bool(await now(store) > at)


async def test_a_rate_admits_that_many_starts_per_period_and_records_them(store: Store) -> None:
    made = [await put(store, rate=3, rate_period=1.0, rate_key="") for _ in range(7)]
    first = await fetch(store, "tok", limit=10)
    assert [t.id for t in first] == made[:3]
    assert await fetch(store, "tok2", limit=10) == []  # over the rate: waiting, not failed
    assert (await states(store))[made[3]] == ("available", 0)
    started = (await row(store, made[0])).started_at
    await until(lambda: _past(store, started + timedelta(seconds=1)))
    second = await fetch(store, "tok3", limit=10)
    assert [t.id for t in second] == made[3:6]
    async with store.engine.connect() as conn:
        starts = (await conn.execute(sa.text("SELECT count(*) FROM oncely_task_starts"))).scalar()
    assert starts == 3  # the first period's starts no longer count: forgotten


async def test_rate_groups_are_per_key(store: Store) -> None:
    a = [await put(store, rate=1, rate_period=60.0, rate_key="a") for _ in range(2)]
    b = [await put(store, rate=1, rate_period=60.0, rate_key="b") for _ in range(2)]
    assert {t.id for t in await fetch(store, "tok", limit=10)} == {a[0], b[0]}
    assert await fetch(store, "tok2", limit=10) == []


async def test_a_group_another_transaction_is_leasing_is_skipped_without_waiting(
    pg_store: Store,
) -> None:
    """Postgres: while one transaction's lease of group a is open, another lease skips group
    a (its lock is taken) and takes the rest at once; after the commit, the live lease
    counts. SQLite has one writer at a time: leases never overlap there."""
    a = [await put(pg_store, **conc("a")) for _ in range(2)]
    b = await put(pg_store, **conc("b"))
    async with pg_store.engine.connect() as holder:
        async with holder.begin():
            held = await lease_in(pg_store, holder, "tok-holder", limit=1)
            assert [t.id for t in held] == [a[0]]
            other = await asyncio.wait_for(fetch(pg_store, "tok-other"), timeout=10)
            assert [t.id for t in other] == [b]
        assert await fetch(pg_store, "tok-late") == []
    assert (await row(pg_store, a[1])).state == "available"


async def test_an_ack_with_a_result_stores_it_with_the_success(store: Store) -> None:
    one, two = await put(store), await put(store)
    leased = await fetch(store, "tok")
    assert await ack(store, leased, {one: '{"total": 42, "note": "\\u00e9t\\u00e9"}'}) == {one, two}
    assert (await row(store, one)).result == '{"total": 42, "note": "\\u00e9t\\u00e9"}'
    assert (await row(store, two)).result is None
    assert (await store.tasks.get(one)).result == {"total": 42, "note": "été"}  # type: ignore[union-attr]


async def test_an_ack_with_a_result_and_a_stale_token_stores_nothing(store: Store) -> None:
    one = await put(store)
    [item] = await fetch(store, "tok")
    stale = Leased(item.id, item.task, item.args, item.attempt, item.queue, "not-the-token")
    assert await ack(store, [stale], {one: "1"}) == set()
    assert ((await row(store, one)).state, (await row(store, one)).result) == ("running", None)
