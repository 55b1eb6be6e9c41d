"""What a worker's batch sends to Postgres, and how many tasks it leases: counts, not times.

While its tasks succeed, a task that writes costs one round trip in its batch (its
statement); after a task failed, the worker gives each task a savepoint for a while (two round
trips). The batch's tasks are acked together in one statement before the commit. A
transaction holds at most `SAVEPOINTS` tasks that wrote (Postgres caches 64 subtransactions
per transaction), so a larger batch commits in several transactions.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from queue_helpers import effects, in_tx  # type: ignore[import-not-found]
from tests.conftest import wire_messages

from oncely import Oncely, RetryPolicy
from oncely.queue import CAUTION, DEFAULT_BATCH, SAVEPOINTS, Worker

INSERT = sa.text("INSERT INTO effects (n) VALUES (:n)")


async def one_batch(app: Oncely, worker: Worker, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Lease every due task and run them as one batch; the messages it sent (not parses)."""
    async with app.store.engine.connect() as conn:
        leased = await app.store.tasks.fetch(conn, None, 1000, worker.token(), "A", 30)
        with wire_messages(monkeypatch) as sent:
            await worker.run_batch(conn, leased)
    return [m for m in sent if m != b"P"]


@pytest.mark.postgres
async def test_a_batch_costs_one_round_trip_per_task_that_writes_two_after_a_failure(
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

    writers = SAVEPOINTS + 10
    worker = Worker(app, batch=1000)
    await in_tx(app, lambda db: record.enqueue_many(db, [{"n": n} for n in range(writers)]))
    await in_tx(app, lambda db: nothing.enqueue_many(db, [{"n": n} for n in range(5)]))
    executed = await one_batch(app, worker, monkeypatch)
    assert await effects(app) == list(range(writers))
    # Q = simple query, B = bind+execute, P = parse (a statement's first use): one each is a
    # round trip. Two transactions (the first closes after SAVEPOINTS tasks that wrote), each:
    # BEGIN; an insert per task that wrote; one ack; SET LOCAL synchronous_commit; COMMIT.
    # The no-op tasks send nothing of their own.
    assert len(executed) == writers + 2 * 4
    assert executed.count(b"Q") == 2 * 2

    # A task fails (before writing: nothing to roll back): from then on every task that
    # writes opens a savepoint first, for CAUTION transactions.
    await in_tx(app, lambda db: refuse.enqueue(db, n=0))
    # BEGIN; its outcome; SET LOCAL synchronous_commit; COMMIT (no task to ack).
    assert len(await one_batch(app, worker, monkeypatch)) == 4
    await in_tx(app, lambda db: record.enqueue_many(db, [{"n": n} for n in range(writers)]))
    executed = await one_batch(app, worker, monkeypatch)
    assert len(executed) == 2 * writers + 2 * 4
    # The savepoints after a transaction's first go to asyncpg itself (a simple query).
    assert executed.count(b"Q") == 2 * 2 + (writers - 2)
    # The caution lasts CAUTION transactions without a failure (two of them just passed).
    for _ in range(CAUTION - 2):
        await in_tx(app, lambda db: record.enqueue(db, n=-1))
        assert len(await one_batch(app, worker, monkeypatch)) == 2 + 4
    await in_tx(app, lambda db: record.enqueue(db, n=-1))
    assert len(await one_batch(app, worker, monkeypatch)) == 1 + 4


def test_a_worker_leases_about_a_second_of_work_at_once(app: Oncely) -> None:
    worker = Worker(app, batch=500)
    assert worker.limit() == DEFAULT_BATCH  # before it has timed any task
    worker._learn(100, 100 * 0.0001)  # fast tasks: as many as it may
    assert worker.limit() == 500
    for _ in range(20):
        worker._learn(10, 10 * 2.0)  # tasks of two seconds: one at a time
    assert worker.limit() == 1
    for _ in range(20):
        worker._learn(10, 10 * 0.01)
    assert 50 <= worker.limit() <= 150
    assert Worker(app, batch=7).limit() == 7
