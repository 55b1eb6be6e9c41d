"""What a worker's batch sends to Postgres, and how many tasks it leases: counts, not times.

A task that writes costs two round trips in its batch (its savepoint, its statement); the
batch's tasks are acked together in one statement before the commit. A transaction holds at
most `SAVEPOINTS` tasks that wrote (Postgres caches 64 subtransactions per transaction), so a
larger batch commits in several transactions.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from queue_helpers import effects, in_tx  # type: ignore[import-not-found]
from tests.conftest import wire_messages

from oncely import Oncely
from oncely.queue import DEFAULT_BATCH, SAVEPOINTS, Worker

INSERT = sa.text("INSERT INTO effects (n) VALUES (:n)")


@pytest.mark.postgres
async def test_a_batch_costs_two_round_trips_per_task_that_writes(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = pg_app

    @app.task
    async def record(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    @app.task
    async def nothing(db, n: int):  # type: ignore[no-untyped-def]
        return None

    writers = SAVEPOINTS + 10
    await in_tx(app, lambda db: record.enqueue_many(db, [{"n": n} for n in range(writers)]))
    await in_tx(app, lambda db: nothing.enqueue_many(db, [{"n": n} for n in range(5)]))
    worker = Worker(app, batch=1000)
    async with app.store.engine.connect() as conn:
        leased = await app.store.tasks.fetch(conn, None, 1000, worker.token(), "A", 30)
        assert len(leased) == writers + 5
        with wire_messages(monkeypatch) as sent:
            await worker.run_batch(conn, leased)
    assert await effects(app) == list(range(writers))
    # Q = simple query, B = bind+execute, P = parse (a statement's first use): one each is a
    # round trip. Two transactions (the first closes after SAVEPOINTS tasks that wrote), each:
    # BEGIN; a savepoint and an insert per task that wrote; one ack; SET LOCAL
    # synchronous_commit; COMMIT. The no-op tasks send nothing of their own.
    executed = [m for m in sent if m != b"P"]
    assert len(executed) == 2 * writers + 2 * 4
    # The savepoints after a transaction's first go to asyncpg itself (a simple query).
    assert executed.count(b"Q") == 2 * 2 + (writers - 2)


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
