"""oncely's schema versions on SQLite and Postgres: `oncely migrate` upgrades a database in
place, keeping its tasks and what the schema guarantees (guarantee 6: idempotency keys)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from tests.conftest import run_cli

from oncely import Oncely
from oncely.queue import list_tasks
from oncely.schema import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
V2_INDEXES = {
    "oncely_tasks_idempotency",
    "oncely_tasks_due",
    "oncely_tasks_due_by_queue",
    "oncely_tasks_leases",
    "oncely_tasks_state",
}
V3_INDEXES = V2_INDEXES - {"oncely_tasks_idempotency", "oncely_tasks_state"} | {
    "oncely_tasks_key",
    "oncely_tasks_finished",
}
V4_INDEXES = V3_INDEXES | {"oncely_tasks_failed"}


def task_indexes(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return {ix["name"] for ix in sa.inspect(conn).get_indexes("oncely_tasks") if ix["name"]}


def as_v2(engine: sa.Engine) -> None:
    """Turn a migrated database back into schema v2 as v2 built it (its two full indexes)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX oncely_tasks_failed")
        conn.exec_driver_sql("DROP INDEX oncely_tasks_key")
        conn.exec_driver_sql("DROP INDEX oncely_tasks_finished")
        conn.exec_driver_sql(
            "CREATE UNIQUE INDEX oncely_tasks_idempotency ON oncely_tasks (task, idempotency_key)"
        )
        conn.exec_driver_sql("CREATE INDEX oncely_tasks_state ON oncely_tasks (state, finished_at)")
        conn.exec_driver_sql("DELETE FROM oncely_schema WHERE version > 2")


async def test_a_new_database_gets_the_latest_schema(db_url: str, sync_engine: sa.Engine) -> None:
    app = Oncely(db_url)
    assert await app.migrate() == list(range(1, SCHEMA_VERSION + 1))
    await app.aclose()
    assert task_indexes(sync_engine) == V4_INDEXES


async def test_migrate_upgrades_a_v2_database_keeping_its_tasks_and_keys(
    db_url: str, sync_engine: sa.Engine
) -> None:
    app = Oncely(db_url)
    await app.migrate()
    await app.aclose()
    as_v2(sync_engine)
    assert task_indexes(sync_engine) == V2_INDEXES

    # This oncely runs on a v2 database (so every process can be upgraded before migrating).
    app = Oncely(db_url)

    @app.task
    async def charge(db, order_id: int):  # type: ignore[no-untyped-def]
        pass

    async def enqueue(**kwargs: object):  # type: ignore[no-untyped-def]
        async with AsyncSession(app.store.engine) as db, db.begin():
            return await charge.enqueue(db, **kwargs)

    await app.store.ensure_schema()
    keyed = await enqueue(order_id=1, idempotency_key="c:1")
    done = await enqueue(order_id=2, idempotency_key="c:2")
    plain = [await enqueue(order_id=3), await enqueue(order_id=3)]
    assert (await enqueue(order_id=1, idempotency_key="c:1")).duplicate
    with sync_engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE oncely_tasks SET state = 'succeeded' WHERE id = :id"), {"id": done.id}
        )
    before = {r.id: (r.task, r.args, r.state, r.idempotency_key) for r in await list_tasks(app)}
    await app.aclose()

    result = run_cli("migrate", cwd=ROOT, env={"ONCELY_DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    assert "to version 4 (applied [3, 4])" in result.stdout
    assert task_indexes(sync_engine) == V4_INDEXES

    app = Oncely(db_url)
    charge = app.task(charge.func, name="charge")
    assert await app.store.schema_version() == SCHEMA_VERSION
    after = {r.id: (r.task, r.args, r.state, r.idempotency_key) for r in await list_tasks(app)}
    assert after == before and len(after) == 4
    # The keys are still unique among retained tasks, whatever their state; tasks without a
    # key are as many as enqueued.
    again = await enqueue(order_id=1, idempotency_key="c:1")
    finished = await enqueue(order_id=2, idempotency_key="c:2")
    assert (again.id, again.duplicate) == (keyed.id, True)
    assert (finished.id, finished.duplicate) == (done.id, True)
    more = await enqueue(order_id=3)
    assert not more.duplicate and more.id not in {p.id for p in plain}
    with pytest.raises(sa.exc.IntegrityError), sync_engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, "
                "created_at, idempotency_key) SELECT task, queue, args, 'available', 0, run_at, "
                "created_at, idempotency_key FROM oncely_tasks WHERE id = :id"
            ),
            {"id": keyed.id},
        )
    assert len(await list_tasks(app)) == 5
    await app.aclose()
