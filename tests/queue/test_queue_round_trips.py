"""What a worker sends to Postgres per task, and how many connections it holds: counts, not
times.

A task that writes one row costs three round trips in its own transaction: its BEGIN (with
the durable-commit setting), its statement, and its ack with the COMMIT in one message. A task
that makes no statement costs none of its own: its ack is written with others' in one
statement. A worker holds at most its pool's connections for tasks, plus one for its own
statements (and one for LISTEN), however many tasks run at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from queue_helpers import drain, effects, in_tx  # type: ignore[import-not-found]
from tests.conftest import wire_messages

from oncely import Oncely, RetryPolicy
from oncely.queue import worker

INSERT = sa.text("INSERT INTO effects (n) VALUES (:n)")


@pytest.mark.postgres
async def test_a_task_costs_three_round_trips_if_it_writes_none_if_it_does_not(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = pg_app

    @app.task
    async def record(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    @app.task
    async def nothing(db, n: int):  # type: ignore[no-untyped-def]
        return None

    @app.task(retry=RetryPolicy(attempts=1))
    async def refuse(db, n: int):  # type: ignore[no-untyped-def]
        raise ValueError("refused before writing")

    runner = worker(app, concurrency=1)
    for task, n in ((record, 20), (nothing, 20), (refuse, 5)):
        await in_tx(app, lambda db, t=task, n=n: t.enqueue_many(db, [{"n": i} for i in range(n)]))
    async with app.store.engine.connect() as conn:
        leased = await app.store.tasks.fetch(conn, None, 1000, runner.token(), "A", 30)
    by_task = {name: [i for i in leased if i.task == name] for name in ("record", "nothing")}
    await runner.run(by_task["record"][0])  # the pool's connection is open, its statement known

    with wire_messages(monkeypatch) as sent:
        for item in by_task["record"][1:]:
            await runner.run(item)
    messages = [m for m in sent if m != b"P"]
    # Per task: BEGIN (Q), its INSERT (B), its ack and COMMIT (Q).
    assert messages == [b"Q", b"B", b"Q"] * 19

    with wire_messages(monkeypatch) as sent:
        outcomes = [await runner.run(item) for item in by_task["nothing"]]
    assert sent == []  # no statement, no connection: nothing sent while they ran
    with wire_messages(monkeypatch) as sent:
        await runner.settle(outcomes)
    # All 20 acks in one statement (here in a transaction of its own, on the app's engine:
    # BEGIN, the UPDATE, COMMIT; after the connection's startup, if it was new).
    assert [m for m in sent if m not in (b"P", b"\x00")] == [b"Q", b"B", b"Q"]
    await runner.close()
    assert await effects(app) == list(range(20))
    counts = await app.store.tasks.count()
    assert counts["succeeded"] == 40


@pytest.mark.postgres
async def test_a_worker_holds_at_most_its_pool_whatever_its_concurrency(
    pg_app: Oncely,
) -> None:
    """100 tasks that await before they write, at concurrency 100 on a pool of 3: every task
    runs (all at once: each waits for the others to start), and the server never sees more
    than 3 connections of the pool, plus the worker's control and LISTEN connections."""
    app = pg_app
    started: set[int] = set()
    everyone = asyncio.Event()
    peak = 0

    @app.task
    async def call_then_write(db, n: int):  # type: ignore[no-untyped-def]
        started.add(n)
        if len(started) == 100:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), 60)  # all 100 in flight at once
        await db.execute(INSERT, {"n": n})

    await in_tx(app, lambda db: call_then_write.enqueue_many(db, [{"n": n} for n in range(100)]))

    async def connections() -> int:
        async with app.store.engine.connect() as conn:
            query = sa.text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return int((await conn.execute(query)).scalar_one())

    before = await connections()

    async def done() -> bool:
        nonlocal peak
        peak = max(peak, await connections() - before)
        return await effects(app) == list(range(100))

    await drain(app, done, concurrency=100, pool_size=3, timeout=60)
    assert len(started) == 100
    assert 1 <= peak <= 3 + 2


@pytest.mark.postgres
async def test_a_worker_whose_tasks_make_no_statement_holds_two_connections_while_they_run(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks that only wait (an HTTP call) take no connection; the worker's own reads while
    they run (its look for operators' cancels among them) go on its control connection, not
    a third one of the app's engine: its control and LISTEN connections, nothing else."""
    import asyncpg

    from oncely.work.tasks import timing as work_tasks

    app = pg_app
    monkeypatch.setattr(work_tasks, "CANCEL_CHECK_S", 0.02)
    looks = 0
    looked_twice = asyncio.Event()
    real = app.store.control.cancel_requested

    async def counted(ids: Any, engine: Any = None) -> set[int]:
        nonlocal looks
        asked = await real(ids, engine)
        looks += 1
        if looks >= 2:
            looked_twice.set()
        return asked

    monkeypatch.setattr(app.store.control, "cancel_requested", counted)
    release = asyncio.Event()

    @app.task
    async def wait_for_release(db, n: int):  # type: ignore[no-untyped-def]
        await release.wait()

    await in_tx(app, lambda db: wait_for_release.enqueue_many(db, [{"n": n} for n in range(5)]))
    await app.store.ensure_schema()
    await app.store.engine.dispose()  # from here on, only the worker's connections
    probe = await asyncpg.connect(
        app.store.engine.url.set(drivername="postgresql").render_as_string(False)
    )
    held: list[int] = []

    async def done() -> bool:
        if looked_twice.is_set() and not held:
            held.append(
                await probe.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
            release.set()
        counts = await probe.fetch("SELECT state, count(*) FROM oncely_tasks GROUP BY state")
        return dict(counts) == {"succeeded": 5}

    try:
        await drain(app, done, concurrency=5, pool_size=3, timeout=60)
    finally:
        await probe.close()
    assert looks >= 2
    assert held == [2]  # control and LISTEN


@pytest.mark.postgres
async def test_a_workers_lease_goes_on_the_driver_not_through_sqlalchemy(
    pg_app: Oncely,
) -> None:
    """On asyncpg a worker's lease is its prepared statement sent on the driver of its
    control connection: SQLAlchemy's statement machinery (more CPU than the round trip, and
    between a notification and the task's start) never sees it. The tasks it leases run,
    with their arguments, each once."""
    app = pg_app
    ran: list[int] = []

    @app.task
    async def record(db, n: int, tag: str):  # type: ignore[no-untyped-def]
        assert tag == f"t{n}"
        ran.append(n)

    await in_tx(
        app, lambda db: record.enqueue_many(db, [{"n": n, "tag": f"t{n}"} for n in range(5)])
    )
    through: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        through.append(statement.lstrip()[:20])

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
    try:
        async with app.store.engine.connect() as conn:  # the listener hears SQLAlchemy's
            await conn.execute(sa.text("SELECT 'listening'"))
        await drain(app, lambda: _ran_all(ran, 5), concurrency=2)
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
    assert sorted(ran) == list(range(5))
    assert "SELECT 'listening'" in through
    assert not [s for s in through if s.startswith("WITH free")]


async def _ran_all(ran: list[int], count: int) -> bool:
    return len(ran) >= count


@pytest.mark.postgres
async def test_a_tasks_ack_calls_its_function(pg_app: Oncely) -> None:
    """Schema 13's ack is a function the server plans once per connection (a statement
    sent as text is planned at every task): each task that writes calls it once, and its
    work commits with it. (This oncely needs schema 14: no older database acks here.)"""
    app = pg_app
    async with app.store.engine.begin() as conn:
        name = (await conn.execute(sa.text("SELECT current_database()"))).scalar_one()
        await conn.execute(sa.text(f"ALTER DATABASE \"{name}\" SET track_functions = 'pl'"))
    try:
        await _record_tasks(app, range(0, 6))
        calls = await _ack_calls(app, at_least=6)
    finally:
        async with app.store.engine.begin() as conn:
            await conn.execute(sa.text(f'ALTER DATABASE "{name}" RESET track_functions'))
    assert calls == 6
    assert await effects(app) == list(range(6))


async def _record_tasks(app: Oncely, numbers: range) -> None:
    """Enqueue `record(n)` for each number and drain them: each task inserts its row."""

    @app.task
    async def record(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    await in_tx(app, lambda db: record.enqueue_many(db, [{"n": n} for n in numbers]))
    await drain(app, lambda: _has_effects(app, numbers[-1]), concurrency=2, pool_size=2)
    async with app.store.engine.connect() as conn:
        states = await conn.execute(sa.text("SELECT DISTINCT state FROM oncely_tasks"))
        assert [s for (s,) in states] == ["succeeded"]


async def _has_effects(app: Oncely, last: int) -> bool:
    return last in await effects(app)


async def _ack_calls(app: Oncely, *, at_least: int) -> int:
    """Calls of the ack's function the server counted, once the worker's connections closed
    and flushed their counts (read until there are `at_least`, for at most 30 s)."""
    query = sa.text(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
        "WHERE funcname = 'oncely_task_ack'"
    )
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        async with app.store.engine.connect() as conn:
            await conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            calls = int((await conn.execute(query)).scalar_one())
        if calls >= at_least or asyncio.get_running_loop().time() > deadline:
            return calls
        await asyncio.sleep(0.1)


@pytest.mark.postgres
async def test_leased_ahead_tasks_that_take_lanes_freed_together_are_counted_in_one_statement(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 no-op tasks at concurrency 10: the attempts that end in one turn of the event loop
    free their lanes together, and the leased-ahead tasks that take those lanes have their
    attempts counted in one statement, not one statement each. Every task still runs once,
    its attempt counted once."""
    app = pg_app
    ran: list[int] = []

    @app.task
    async def nothing(db, n: int):  # type: ignore[no-untyped-def]
        ran.append(n)

    calls: list[int] = []
    counting = app.store.tasks.begin_attempts

    async def counted(leased: Any, engine: Any) -> dict[int, int]:
        calls.append(len(leased))
        return await counting(leased, engine)

    monkeypatch.setattr(app.store.tasks, "begin_attempts", counted)
    await in_tx(app, lambda db: nothing.enqueue_many(db, [{"n": i} for i in range(200)]))

    async def done() -> bool:
        return (await app.store.tasks.count()).get("succeeded", 0) == 200

    await drain(app, done, concurrency=10)
    assert sorted(ran) == list(range(200))
    async with app.store.engine.connect() as conn:
        attempts = (await conn.execute(sa.text("SELECT attempt FROM oncely_tasks"))).scalars()
        assert set(attempts) == {1}
    assert sum(calls) > 0  # tasks were leased ahead and counted as they started
    assert len(calls) <= sum(calls) / 2, calls  # without: [1, 1, 1, ...], one per task
