"""Guarantees 6, 7 and 9 in one worker process: work and ack commit together, retries follow
the policy, a lost lease rolls the work back, and a task's code runs again only when its own
attempt failed. Real SQLite and Postgres."""

from __future__ import annotations

import asyncio
import time

import pytest
import sqlalchemy as sa
from queue_helpers import drain, effects, in_tx  # type: ignore[import-not-found]

from oncely import JobTransactionError, Oncely, RetryPolicy, TaskState
from oncely.queue import list_tasks, retry_task, worker
from oncely.work.tasks import TaskWorker
from oncely.work.tasks.outcome import LeaseLost, Outcome

INSERT = sa.text("INSERT INTO effects (n) VALUES (:n)")
FAST = {"wait": 0.01, "backoff": "fixed", "jitter": 0}


class Transient(Exception):
    pass


class Gone(Exception):
    pass


async def states(app: Oncely) -> dict[int, tuple[str, int]]:
    return {r.id: (r.state.value, r.attempt) for r in await list_tasks(app, limit=10000)}


def finished(app: Oncely, n: int):  # type: ignore[no-untyped-def]
    async def done() -> bool:
        recs = await list_tasks(app, limit=10000)
        return len(recs) == n and all(
            r.state in (TaskState.SUCCEEDED, TaskState.DEAD, TaskState.DISCARDED) for r in recs
        )

    return done


async def test_queue_tasks_take_effect_once_work_and_ack_commit_together(
    app: Oncely, recorded
) -> None:  # type: ignore[no-untyped-def]
    @app.task
    async def record(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    await in_tx(app, lambda db: record.enqueue_many(db, [{"n": i} for i in range(50)]))
    await drain(app, finished(app, 50), concurrency=3, batch=7)
    assert await effects(app) == list(range(50))
    assert set((await states(app)).values()) == {("succeeded", 1)}
    assert len(recorded.named("task.succeeded")) == 50
    started = recorded.named("task.started")[0]
    assert set(started) == {"task", "id", "attempt"} and started["attempt"] == 1
    assert "duration_ms" in recorded.named("task.succeeded")[0]


async def test_queue_tasks_take_effect_once_a_task_that_writes_then_raises(
    app: Oncely, recorded
) -> None:  # type: ignore[no-untyped-def]
    """Each failed attempt's write rolls back; the retry's write is the only effect."""
    calls: list[int] = []

    @app.task(retry=RetryPolicy(attempts=5, **FAST))  # type: ignore[arg-type]
    async def charge(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})
        calls.append(n)
        if len(calls) < 3:
            raise Transient(f"gateway timeout #{len(calls)}")

    rec = await in_tx(app, lambda db: charge.enqueue(db, n=7))
    await drain(app, finished(app, 1))
    assert calls == [7, 7, 7]
    assert await effects(app) == [7]
    assert (await states(app))[rec.id] == ("succeeded", 3)
    retries = recorded.named("task.retry")
    assert [(r["attempt"], r["wait"]) for r in retries] == [(1, 0.01), (2, 0.01)]
    assert retries[0]["error"] == "Transient: gateway timeout #1"


async def test_retries_follow_the_policy_discard_retry_on_and_exhaustion(
    app: Oncely, recorded
) -> None:  # type: ignore[no-untyped-def]
    @app.task(retry=RetryPolicy(attempts=3, discard_on=[Gone], **FAST))  # type: ignore[arg-type]
    async def gone(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})
        raise Gone("order 1 no longer exists")

    @app.task(retry=RetryPolicy(attempts=3, retry_on=[Transient], **FAST))  # type: ignore[arg-type]
    async def picky(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})
        raise ValueError("not retryable")

    @app.task(retry=RetryPolicy(attempts=3, **FAST))  # type: ignore[arg-type]
    async def always(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})
        raise Transient("still down")

    ids = [
        (await in_tx(app, lambda db, t=t, n=n: t.enqueue(db, n=n))).id
        for t, n in ((gone, 1), (picky, 2), (always, 3))
    ]
    await drain(app, finished(app, 3))
    got = await states(app)
    assert [got[i] for i in ids] == [("discarded", 1), ("dead", 1), ("dead", 3)]
    assert await effects(app) == []
    recs = {r.id: r for r in await list_tasks(app)}
    assert recs[ids[0]].error.startswith("Gone: order 1 no longer exists")  # type: ignore[union-attr]
    assert "Traceback" in recs[ids[2]].error  # type: ignore[operator]
    assert [d["task"] for d in recorded.named("task.discarded")] == ["gone"]
    dead = {d["task"]: d for d in recorded.named("task.dead")}
    assert "retry_on" in dead["picky"]["reason"] and dead["always"]["attempt"] == 3
    assert len(recorded.named("task.retry")) == 2

    # Dead tasks are kept and re-runnable by hand, with a fresh set of attempts.
    @app.task(name="fixed")
    async def fixed(db, n: int):  # type: ignore[no-untyped-def]
        pass

    await retry_task(app, ids[2])
    assert (await states(app))[ids[2]] == ("available", 0)


async def test_a_failing_task_rolls_back_only_its_own_savepoint(app: Oncely) -> None:
    """In one batch transaction, a failure undoes its own work, not its neighbours'."""

    @app.task(retry=RetryPolicy(attempts=1))
    async def maybe(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})
        if n % 3 == 0:
            raise Transient("every third fails")

    await in_tx(app, lambda db: maybe.enqueue_many(db, [{"n": i} for i in range(1, 13)]))
    await drain(app, finished(app, 12), concurrency=1, batch=12)
    assert await effects(app) == [1, 2, 4, 5, 7, 8, 10, 11]
    dead = [s for s in (await states(app)).values() if s[0] == "dead"]
    assert len(dead) == 4


async def test_a_task_that_breaks_the_sql_transaction_fails_alone(app: Oncely) -> None:
    """A failed statement (aborting the transaction on Postgres) is contained by the savepoint."""

    @app.task(retry=RetryPolicy(attempts=1))
    async def bad_sql(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})
        if n == 2:
            await db.execute(sa.text("INSERT INTO no_such_table VALUES (1)"))

    await in_tx(app, lambda db: bad_sql.enqueue_many(db, [{"n": i} for i in (1, 2, 3)]))
    await drain(app, finished(app, 3), concurrency=1, batch=10)
    assert await effects(app) == [1, 3]


async def test_a_task_that_commits_itself_lands_nothing(app: Oncely) -> None:
    @app.task(retry=RetryPolicy(attempts=1))
    async def committer(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})
        await db.commit()

    rec = await in_tx(app, lambda db: committer.enqueue(db, n=1))
    await drain(app, finished(app, 1))
    assert await effects(app) == []
    (task,) = await list_tasks(app)
    assert task.id == rec.id and task.state is TaskState.DEAD
    assert task.error is not None and task.error.startswith(JobTransactionError.__name__)


async def test_sync_task_and_no_db_task(app: Oncely) -> None:
    seen: list[int] = []

    @app.task
    def sync_record(db, n: int):  # type: ignore[no-untyped-def]
        db.execute(INSERT, {"n": n})

    @app.task
    async def no_db(db, n: int):  # type: ignore[no-untyped-def]
        seen.append(n)

    await in_tx(app, lambda db: sync_record.enqueue(db, n=1))
    await in_tx(app, lambda db: no_db.enqueue_many(db, [{"n": 2}, {"n": 3}]))
    await drain(app, finished(app, 3))
    assert await effects(app) == [1] and sorted(seen) == [2, 3]
    assert {s for s, _ in (await states(app)).values()} == {"succeeded"}


async def test_timeout_fails_the_attempt(app: Oncely) -> None:
    @app.task(retry=RetryPolicy(attempts=1), timeout=0.2)
    async def slow(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})
        await asyncio.sleep(30)

    await in_tx(app, lambda db: slow.enqueue(db, n=1))
    await drain(app, finished(app, 1))
    (task,) = await list_tasks(app)
    assert task.state is TaskState.DEAD and task.error.startswith("TimeoutError")  # type: ignore[union-attr]
    assert await effects(app) == []


async def test_future_tasks_wait_for_run_at(app: Oncely) -> None:
    @app.task
    async def later(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    await in_tx(app, lambda db: later.enqueue(db, n=1, delay=3600))
    await in_tx(app, lambda db: later.enqueue(db, n=2))
    await drain(app, lambda: _effects_are(app, [2]))
    assert sorted(s for s, _ in (await states(app)).values()) == ["available", "succeeded"]


async def _effects_are(app: Oncely, expected: list[int]) -> bool:
    return await effects(app) == expected


async def test_queue_tasks_take_effect_once_lease_stolen_from_a_slow_worker(
    app: Oncely, recorded
) -> None:  # type: ignore[no-untyped-def]
    """Worker A leases a task and stalls past its lease; B takes it over and commits; when A
    finally runs it, A's ack (compare-and-set on the lease token) fails: A's work rolls back."""

    @app.task
    async def charge(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    rec = await in_tx(app, lambda db: charge.enqueue(db, n=1))
    slow, fast = worker(app, lease=0.2), worker(app, lease=5)
    async with app.store.engine.connect() as conn_a, app.store.engine.connect() as conn_b:
        leased = await app.store.tasks.fetch(conn_a, None, 10, slow.token(), "A", 0.2)
        assert [t.id for t in leased] == [rec.id]
        deadline = time.monotonic() + 20
        while not await app.store.tasks.rescue():  # B's rescuer, once A's lease ran out
            assert time.monotonic() < deadline, "the lease never expired"
            await asyncio.sleep(0.05)
        stolen = await app.store.tasks.fetch(conn_b, None, 10, fast.token(), "B", 5)
        assert [t.attempt for t in stolen] == [2]
    await fast.settle([await fast.run(stolen[0])])
    # A runs the task: its insert, then a failed ack.
    assert await slow.settle([await slow.run(leased[0])]) == [LeaseLost(leased[0])]
    await fast.close()
    await slow.close()
    assert await effects(app) == [1]
    assert (await states(app))[rec.id] == ("succeeded", 2)
    assert [e["id"] for e in recorded.named("task.lease_lost")] == [rec.id]
    assert [e["attempt"] for e in recorded.named("task.succeeded")] == [2]


async def test_queue_tasks_take_effect_once_one_lease_of_three_stolen(
    app: Oncely, recorded
) -> None:  # type: ignore[no-untyped-def]
    """A leased three tasks; B took one of them over before A ran it. Each of A's tasks runs
    in its own transaction: the stolen one's ack fails and its insert rolls back, the other
    two commit, and no task's code runs twice on A (no rerun because of a neighbour)."""
    calls: list[tuple[str, int]] = []

    @app.task
    async def charge(db, n: int):  # type: ignore[no-untyped-def]
        calls.append((runner, n))
        await db.execute(INSERT, {"n": n})

    await in_tx(app, lambda db: charge.enqueue_many(db, [{"n": n} for n in (1, 2, 3)]))
    slow, fast = worker(app, lease=0.2), worker(app, lease=5)
    async with app.store.engine.connect() as conn_a, app.store.engine.connect() as conn_b:
        leased = await app.store.tasks.fetch(conn_a, None, 10, slow.token(), "A", 0.2)
        assert len(leased) == 3
        deadline = time.monotonic() + 20
        while not (rescued := await app.store.tasks.rescue(limit=1)):
            assert time.monotonic() < deadline, "the lease never expired"
            await asyncio.sleep(0.05)
        (stolen,) = await app.store.tasks.fetch(conn_b, None, 10, fast.token(), "B", 5)
        assert stolen.id == rescued[0].id
    runner = "B"
    await fast.settle([await fast.run(stolen)])
    runner = "A"
    await slow.settle([await slow.run(item) for item in leased])
    await fast.close()
    await slow.close()
    assert await effects(app) == [1, 2, 3]
    by_id = {item.id: item.args["n"] for item in leased}
    assert sorted(n for who, n in calls if who == "A") == sorted(by_id.values())
    assert [e["id"] for e in recorded.named("task.lease_lost")] == [stolen.id]
    assert sorted(e["id"] for e in recorded.named("task.succeeded")) == sorted(by_id)
    assert {i: s for i, s in (await states(app)).items()} == {
        i: ("succeeded", 2 if i == stolen.id else 1) for i in by_id
    }


async def test_lease_expired_on_the_last_attempt_goes_dead(app: Oncely) -> None:
    @app.task(retry=RetryPolicy(attempts=1))
    async def once(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    rec = await in_tx(app, lambda db: once.enqueue(db, n=1))
    dying = worker(app, lease=0.1)
    async with app.store.engine.connect() as conn:
        await app.store.tasks.fetch(conn, None, 10, dying.token(), "A", 0.1)  # then "dies"
    deadline = time.monotonic() + 20
    while not await app.store.tasks.rescue():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await drain(app, finished(app, 1))
    (task,) = await list_tasks(app)
    assert (task.id, task.state, task.attempt) == (rec.id, TaskState.DEAD, 2)
    assert await effects(app) == []


async def test_discard_a_running_task_rolls_its_attempt_back(app: Oncely) -> None:
    from oncely.queue import discard_task

    @app.task
    async def charge(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    rec = await in_tx(app, lambda db: charge.enqueue(db, n=1))
    running = worker(app, lease=30)
    async with app.store.engine.connect() as conn:
        leased = await app.store.tasks.fetch(conn, None, 10, running.token(), "A", 30)
    await discard_task(app, rec.id)
    assert await running.settle([await running.run(leased[0])]) == [LeaseLost(leased[0])]
    await running.close()
    assert await effects(app) == []
    assert (await states(app))[rec.id] == ("discarded", 1)


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_queues_limit_what_a_worker_runs(app: Oncely, concurrency: int) -> None:
    @app.task(queue="emails")
    async def email(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    @app.task
    async def other(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    await in_tx(app, lambda db: email.enqueue(db, n=1))
    await in_tx(app, lambda db: other.enqueue(db, n=2))
    await drain(app, lambda: _effects_are(app, [1]), queues=["emails"], concurrency=concurrency)
    assert sorted(s for s, _ in (await states(app)).values()) == ["available", "succeeded"]


class _Base(sa.orm.DeclarativeBase):
    pass


class Effect(_Base):
    __tablename__ = "effects"
    n: sa.orm.Mapped[int] = sa.orm.mapped_column(primary_key=True)
    pid: sa.orm.Mapped[int] = sa.orm.mapped_column(default=0)


async def run_due(app: Oncely, runner: TaskWorker, limit: int = 100) -> list[Outcome]:
    """One step of `runner`: lease the due tasks (up to `limit`), run them, their outcomes."""
    outcomes = await runner.step(limit)
    assert outcomes, "no task was due"
    return outcomes


@pytest.mark.parametrize("how", ["session", "orm", "connection", "driver"])
@pytest.mark.parametrize("concurrency", [1, 3])
async def test_a_failing_task_rolls_back_only_its_own_work_however_it_wrote(
    app: Oncely, how: str, concurrency: int, recorded
) -> None:  # type: ignore[no-untyped-def]
    """Each task runs in its own transaction, begun at its first statement, whether it goes
    through the session, the ORM's flush, the connection or the driver itself (after asking
    the session for the connection): a failing task's write rolls back alone, and no other
    task runs twice, one at a time or several at once."""
    postgres = app.store.dialect.name == "postgresql"
    raw_insert = (
        "INSERT INTO effects (n) VALUES ($1)"
        if postgres
        else ("INSERT INTO effects (n) VALUES (?)")
    )
    calls: list[int] = []

    @app.task(retry=RetryPolicy(attempts=1))
    async def write(db, n: int, fail: bool):  # type: ignore[no-untyped-def]
        calls.append(n)
        if how == "session":
            await db.execute(INSERT, {"n": n})
        elif how == "orm":
            db.add(Effect(n=n))
            await db.flush()
        elif how == "connection":
            await (await db.connection()).execute(INSERT, {"n": n})
        else:
            driver = (await (await db.connection()).get_raw_connection()).driver_connection
            await (driver.execute(raw_insert, n) if postgres else driver.execute(raw_insert, (n,)))
        if fail:
            raise Transient(f"{how} {n}")

    runner = worker(app, concurrency=concurrency)
    for first in (10, 20):
        items = [{"n": first + j, "fail": j == 1} for j in (0, 1, 2)]
        await in_tx(app, lambda db, items=items: write.enqueue_many(db, items))
        await run_due(app, runner)
    assert await effects(app) == [10, 12, 20, 22]
    assert sorted(calls) == [10, 11, 12, 20, 21, 22]  # each once
    assert sorted(s for s, _ in (await states(app)).values()) == ["dead"] * 2 + ["succeeded"] * 4


@pytest.mark.parametrize("concurrency", [1, 10])
async def test_a_failure_reruns_no_other_task(app: Oncely, concurrency: int, recorded) -> None:  # type: ignore[no-untyped-def]
    """Issue 16's rule: in a batch of 50 writers where task 25 fails after its insert, every
    other task's body runs exactly once, and 49 rows land; the failure's retry waits as its
    policy says. The same for tasks that write nothing around it."""
    calls: list[int] = []

    @app.task(retry=RetryPolicy(attempts=3, wait=600, backoff="fixed", jitter=0))
    async def charge(db, n: int):  # type: ignore[no-untyped-def]
        calls.append(n)
        await db.execute(INSERT, {"n": n})
        if n == 25:
            raise Transient(f"gateway timeout on {n}")

    @app.task
    async def ping(db, n: int):  # type: ignore[no-untyped-def]
        calls.append(n)

    async def enqueue(db):  # type: ignore[no-untyped-def]
        recs = await charge.enqueue_many(db, [{"n": n} for n in range(1, 51)])
        return recs + [await ping.enqueue(db, n=n) for n in (51, 52)]

    recs = await in_tx(app, enqueue)
    outcomes = await run_due(app, worker(app, concurrency=concurrency), limit=100)
    assert sorted(calls) == list(range(1, 53))  # 52 body calls for 52 tasks
    assert await effects(app) == [n for n in range(1, 51) if n != 25]
    (retry,) = recorded.named("task.retry")
    assert (retry["id"], retry["attempt"], retry["wait"]) == (recs[24].id, 1, 600)
    assert sorted(type(o).__name__ for o in outcomes) == ["Retried"] + ["Succeeded"] * 51
    got = await states(app)
    assert got.pop(recs[24].id) == ("available", 1)
    assert set(got.values()) == {("succeeded", 1)}
    (charged,) = [r for r in await list_tasks(app) if r.id == recs[24].id]
    assert charged.error is not None and charged.error.startswith("Transient: gateway timeout")


async def test_tasks_see_none_of_each_others_session_state(
    app: Oncely,
) -> None:
    seen: list[tuple[int, int, bool]] = []
    kept: list[Effect] = []  # held, so that they stay in an identity map that is not emptied

    @app.task
    async def leave(db, n: int):  # type: ignore[no-untyped-def]
        seen.append((n, len(list(db)), "mine" in db.info))
        kept.append(Effect(n=n))
        db.add(kept[-1])
        await db.flush()
        db.info["mine"] = n

    await in_tx(app, lambda db: leave.enqueue_many(db, [{"n": n} for n in range(5)]))
    await drain(app, finished(app, 5), concurrency=1, batch=5)
    assert seen == [(n, 0, False) for n in range(5)]
    assert await effects(app) == list(range(5))


async def test_the_operators_task_functions_are_the_apps_methods(app: Oncely) -> None:
    """list / retry / discard / prune tasks on the app itself, beside history and release."""
    from datetime import timedelta

    @app.task(retry=RetryPolicy(attempts=1))
    async def fragile(db, n: int):  # type: ignore[no-untyped-def]
        raise Gone(n)

    rec = await in_tx(app, lambda db: fragile.enqueue(db, n=1))
    other = await in_tx(app, lambda db: fragile.enqueue(db, n=2))
    await run_due(app, worker(app))
    assert [r.state for r in await app.list_tasks(TaskState.DEAD)] == [TaskState.DEAD] * 2
    assert (await app.retry_task(rec.id)).state is TaskState.AVAILABLE
    assert (await app.discard_task(other.id)).state is TaskState.DISCARDED
    assert [r.id for r in await app.list_tasks(task="fragile", limit=1)] == [other.id]
    pruned = await app.prune(timedelta(days=30))
    assert set(pruned.values()) == {0}  # nothing that old
