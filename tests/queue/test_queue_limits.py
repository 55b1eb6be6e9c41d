"""Priorities, results and delayed tasks through a worker, and limits' bad input at enqueue,
on SQLite and Postgres."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from queue_helpers import drain, in_tx  # type: ignore[import-not-found]
from tests.support import ROOT, run_cli

from oncely import (
    BadInputError,
    Oncely,
    ResultTimeoutError,
    RetryPolicy,
    TaskFailedError,
    TaskState,
)
from oncely.queue import list_tasks, prune

ONCE = RetryPolicy(attempts=1)


def all_done(app: Oncely, n: int):  # type: ignore[no-untyped-def]
    async def done() -> bool:
        recs = await list_tasks(app, limit=10000)
        return (
            len(recs) == n
            and all(r.state is not TaskState.AVAILABLE for r in recs)
            and all(r.state is not TaskState.RUNNING for r in recs)
        )

    return done


async def test_a_higher_priority_runs_first_fifo_within_a_priority(app: Oncely) -> None:
    ran: list[int] = []

    @app.task(priority=1)
    async def step(db, n: int) -> None:  # type: ignore[no-untyped-def]
        ran.append(n)

    order = [(0, 0), (1, 2), (2, 1), (3, None), (4, 2), (5, 0), (6, None), (7, 1), (8, 2)]

    async def put(db):  # type: ignore[no-untyped-def]
        for n, priority in order:
            await step.enqueue(db, n=n, priority=priority)

    await in_tx(app, put)
    await drain(app, all_done(app, len(order)), concurrency=1)
    # 2 > 1 (the task's own default, for None) > 0; by id within a level.
    assert ran == [1, 4, 8, 2, 3, 6, 7, 0, 5]
    assert {r.priority for r in await list_tasks(app)} == {0, 1, 2}


async def test_a_task_s_return_value_is_stored_with_its_success_and_returned(
    app: Oncely,
) -> None:
    @app.task
    async def quote(db, n: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
        await db.execute(sa.text("INSERT INTO effects (n) VALUES (:n)"), {"n": n})
        return {"n": n, "price": n * 1.5, "lines": ["a", "é"]}

    @app.task
    async def nothing(db) -> None:  # type: ignore[no-untyped-def]
        return None

    one = await in_tx(app, lambda db: quote.enqueue(db, n=2))
    two = await in_tx(app, lambda db: nothing.enqueue(db))
    with pytest.raises(ResultTimeoutError, match=f"task {one.id} \\(quote\\) is still available"):
        await app.task_result(one.id, timeout=0.1)
    await drain(app, all_done(app, 2))
    assert await app.task_result(one.id, timeout=1) == {"n": 2, "price": 3.0, "lines": ["a", "é"]}
    assert await app.task_result(two.id) is None
    assert (await app.task_record(one.id)).result == {"n": 2, "price": 3.0, "lines": ["a", "é"]}
    # Pruned with its task.
    finished = (await app.task_record(two.id)).finished_at
    assert finished is not None
    assert await prune(app, timedelta(microseconds=1), now=finished + timedelta(seconds=1)) == (
        2,
        0,
    )
    with pytest.raises(BadInputError, match=f"no task with id {one.id}"):
        await app.task_result(one.id, timeout=0)


async def test_a_result_too_large_or_not_json_fails_the_attempt_and_rolls_its_work_back(
    app: Oncely,
) -> None:
    @app.task(retry=ONCE, max_result=1000)
    async def big(db, n: int) -> str:  # type: ignore[no-untyped-def]
        await db.execute(sa.text("INSERT INTO effects (n) VALUES (:n)"), {"n": n})
        return "x" * n

    @app.task(retry=ONCE)
    async def odd(db) -> object:  # type: ignore[no-untyped-def]
        await db.execute(sa.text("INSERT INTO effects (n) VALUES (7)"))
        return {1, 2}

    fits = await in_tx(app, lambda db: big.enqueue(db, n=998))
    over = await in_tx(app, lambda db: big.enqueue(db, n=999))
    bad = await in_tx(app, lambda db: odd.enqueue(db))
    await drain(app, all_done(app, 3))
    assert await app.task_result(fits.id) == "x" * 998
    for rec, text in ((over, "is 1001 bytes of JSON, over its limit of 1000"), (bad, "a set")):
        dead = await app.task_record(rec.id)
        assert dead.state is TaskState.DEAD and dead.result is None
        assert dead.error is not None and dead.error.startswith("ResultError: ")
        assert text in dead.error
        with pytest.raises(TaskFailedError, match=f"task {rec.id} .* is dead: ResultError: "):
            await app.task_result(rec.id)
    async with app.store.engine.connect() as conn:
        rows = await conn.execute(sa.text("SELECT n FROM effects ORDER BY n"))
        assert [r[0] for r in rows] == [998]  # the failed attempts' writes rolled back


async def test_a_delayed_task_is_not_leased_before_its_time_in_database_time(
    app: Oncely,
) -> None:
    ran: list[str] = []

    @app.task
    async def note(db, what: str) -> None:  # type: ignore[no-untyped-def]
        ran.append(what)

    later = await in_tx(
        app, lambda db: note.enqueue(db, what="later", delay=timedelta(seconds=1.5))
    )
    await in_tx(app, lambda db: note.enqueue(db, what="now"))

    async def now_done() -> bool:
        return ran == ["now"]

    await drain(app, now_done)
    rec = await app.task_record(later.id)
    if await app.store.database_time() < rec.run_at:  # checked at once: still before its time
        assert (rec.state, rec.attempt, rec.started_at) == (TaskState.AVAILABLE, 0, None)
    await drain(app, all_done(app, 2))
    rec = await app.task_record(later.id)
    assert ran == ["now", "later"]
    assert rec.started_at is not None and rec.started_at >= rec.run_at


async def test_at_is_run_at_and_a_task_at_a_time_waits_for_it_in_database_time(
    app: Oncely,
) -> None:
    ran: list[int] = []

    @app.task
    async def note(db, n: int) -> None:  # type: ignore[no-untyped-def]
        ran.append(n)

    soon = await app.store.database_time() + timedelta(seconds=1.5)
    away = datetime(2100, 1, 1, tzinfo=timezone(timedelta(hours=-6)))
    first = await in_tx(app, lambda db: note.enqueue(db, n=1, at=soon))
    many = await in_tx(
        app, lambda db: note.enqueue_many(db, [{"n": 2, "at": away}, {"n": 3, "delay": 0}])
    )
    assert first.run_at == soon and many[0].run_at == away  # stored as given, as run_at
    listed = {r.id: r for r in await list_tasks(app)}
    assert listed[many[0].id].run_at == away  # what `oncely tasks` shows (RUN AT)

    async def third_done() -> bool:
        return ran == [3]

    await drain(app, third_done)
    rec = await app.task_record(first.id)
    if await app.store.database_time() < soon:  # checked at once: still before its time
        assert (rec.state, rec.attempt) == (TaskState.AVAILABLE, 0)
    await drain(app, lambda: _ran(ran, [3, 1]))
    rec = await app.task_record(first.id)
    assert rec.started_at is not None and rec.started_at >= soon
    far = await app.task_record(many[0].id)
    assert (far.state, far.attempt) == (TaskState.AVAILABLE, 0)


async def _ran(ran: list[int], expected: list[int]) -> bool:
    return ran == expected


async def test_a_key_function_that_raises_at_enqueue_enqueues_nothing(app: Oncely) -> None:
    @app.task(concurrency=1, concurrency_key=lambda customer: customer["id"])
    async def sync(db, customer: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
        pass

    @app.task(rate="5/s", rate_key=lambda customer: None)
    async def paced(db, customer: int) -> None:  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(BadInputError, match="task 'sync': its concurrency_key raised KeyError"):
        await in_tx(app, lambda db: sync.enqueue(db, customer={"no_id": 1}))
    with pytest.raises(BadInputError, match="task 'sync': its concurrency_key raised"):
        await in_tx(
            app, lambda db: sync.enqueue_many(db, [{"customer": {"id": 1}}, {"customer": {}}])
        )
    with pytest.raises(BadInputError, match="task 'paced': its rate_key must return a str"):
        await in_tx(app, lambda db: paced.enqueue(db, customer=3))
    with pytest.raises(BadInputError, match="priority must be an int"):
        await in_tx(app, lambda db: paced.enqueue(db, customer=3, priority="high"))
    assert await list_tasks(app) == []
    rec = await in_tx(app, lambda db: sync.enqueue(db, customer={"id": 42}))
    assert rec.state is TaskState.AVAILABLE


async def test_tasks_show_prints_a_task_and_its_result(db_url: str, sync_engine: sa.Engine) -> None:
    from tests.apps.limits_app import total

    limits_app = Oncely(db_url)
    limits_app.task(total.func, name="total")
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_APP": "tests.apps.limits_app:app"}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    try:
        rec = await in_tx(limits_app, lambda db: total.enqueue(db, a=2, b=40))
        await drain(limits_app, all_done(limits_app, 1))
    finally:
        await limits_app.aclose()
    shown = run_cli("tasks", "show", str(rec.id), cwd=ROOT, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert f"id: {rec.id}" in lines and "state: succeeded" in lines
    assert 'result: {"sum": 42}' in lines and 'args: {"a": 2, "b": 40}' in lines
    as_json = json.loads(run_cli("tasks", "show", str(rec.id), "--json", cwd=ROOT, env=env).stdout)
    assert (as_json["result"], as_json["priority"]) == ({"sum": 42}, 0)
    missing = run_cli("tasks", "show", "999999", cwd=ROOT, env=env)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "error: no task with id 999999 (never enqueued, or pruned)"
    assert "Traceback" not in missing.stderr
