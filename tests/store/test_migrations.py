"""oncely's schema versions on SQLite and Postgres: `oncely migrate` upgrades a database in
place, keeping its tasks and what the schema guarantees (guarantee 6: idempotency keys)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from tests.support import run_cli

from oncely import Oncely, SchemaMissingError
from oncely.queue import list_tasks
from oncely.schema import SCHEMA_VERSION
from oncely.store.migrations import applied_from

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
V4_INDEXES = V3_INDEXES - {"oncely_tasks_due", "oncely_tasks_due_by_queue"} | {
    "oncely_tasks_next",
    "oncely_tasks_next_by_queue",
    "oncely_tasks_next_limited",
    "oncely_tasks_limited_running",
}
V4_COLUMNS = ("priority", "concurrency_key", "concurrency", "rate_key", "rate", "rate_period")
V4_COLUMNS += ("result",)
LATEST_INDEXES = V4_INDEXES | {"oncely_tasks_failed", "oncely_tasks_available_at"}  # v7, v10


def task_indexes(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return {ix["name"] for ix in sa.inspect(conn).get_indexes("oncely_tasks") if ix["name"]}


def as_v2(engine: sa.Engine) -> None:
    """Turn a migrated database back into schema v2 as v2 built it (its two full indexes,
    its due indexes, none of v4's columns)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX IF EXISTS oncely_tasks_failed")
        conn.exec_driver_sql("DROP INDEX IF EXISTS oncely_tasks_available_at")
        conn.exec_driver_sql("DROP INDEX IF EXISTS oncely_runs_job_slot")
        for name in V4_INDEXES - V3_INDEXES:
            conn.exec_driver_sql(f"DROP INDEX {name}")
        conn.exec_driver_sql("DROP TABLE oncely_task_starts")
        for column in (*V4_COLUMNS, "trace_context"):  # v4's, v9's
            conn.exec_driver_sql(f"ALTER TABLE oncely_tasks DROP COLUMN {column}")
        conn.exec_driver_sql(
            "CREATE INDEX oncely_tasks_due ON oncely_tasks (run_at, id) WHERE state = 'available'"
        )
        conn.exec_driver_sql(
            "CREATE INDEX oncely_tasks_due_by_queue ON oncely_tasks (queue, run_at, id) "
            "WHERE state = 'available'"
        )
        conn.exec_driver_sql("DROP INDEX oncely_tasks_key")
        conn.exec_driver_sql("DROP INDEX oncely_tasks_finished")
        conn.exec_driver_sql(
            "CREATE UNIQUE INDEX oncely_tasks_idempotency ON oncely_tasks (task, idempotency_key)"
        )
        conn.exec_driver_sql("CREATE INDEX oncely_tasks_state ON oncely_tasks (state, finished_at)")
        for table in ("oncely_attempts", "oncely_pauses", "oncely_audit", "oncely_task_cancels"):
            conn.exec_driver_sql(f"DROP TABLE {table}")  # v4's
        conn.exec_driver_sql("DROP TABLE oncely_duplicates")  # v8's
        conn.exec_driver_sql("DROP TABLE oncely_task_errors")  # v11's
        conn.exec_driver_sql("DELETE FROM oncely_schema WHERE version > 2")


def raw_tasks(engine: sa.Engine) -> dict[int, tuple[str, object, str, str | None]]:
    """The tasks as any schema version holds them: id -> (task, args, state, key)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT id, task, args, state, idempotency_key FROM oncely_tasks")
        )
        return {
            r[0]: (r[1], json.loads(r[2]) if isinstance(r[2], str) else r[2], r[3], r[4])
            for r in rows
        }


async def test_a_new_database_gets_the_latest_schema(db_url: str, sync_engine: sa.Engine) -> None:
    app = Oncely(db_url)
    assert await app.migrate() == list(applied_from(1))
    await app.aclose()
    assert task_indexes(sync_engine) == LATEST_INDEXES


async def test_migrate_upgrades_a_v2_database_keeping_its_tasks_and_keys(
    db_url: str, sync_engine: sa.Engine
) -> None:
    app = Oncely(db_url)
    await app.migrate()
    await app.aclose()
    as_v2(sync_engine)
    assert task_indexes(sync_engine) == V2_INDEXES

    # A database an older oncely filled: its rows, as its enqueue wrote them.
    with sync_engine.begin() as conn:
        old_rows = [(1, "c:1", "available"), (2, "c:2", "succeeded")]
        old_rows += [(3, None, "available"), (3, None, "available")]
        for order_id, key, state in old_rows:
            conn.execute(
                sa.text(
                    "INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, "
                    "created_at, idempotency_key) VALUES ('charge', 'default', :args, :state, 0, "
                    "'2026-01-01 00:00:00', '2026-01-01 00:00:00', :key)"
                ),
                {"args": json.dumps({"order_id": order_id}), "state": state, "key": key},
            )
    # This oncely refuses to run on it until it is migrated.
    app = Oncely(db_url)
    with pytest.raises(SchemaMissingError, match="oncely migrate"):
        await app.store.ensure_schema()
    await app.aclose()
    before = raw_tasks(sync_engine)
    ids = {key: i for i, (_, _, _, key) in before.items()}
    plain_ids = {i for i, (_, _, _, key) in before.items() if key is None}

    result = run_cli("migrate", cwd=ROOT, env={"ONCELY_DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    applied = ", ".join(str(v) for v in applied_from(3))
    assert f"to version {SCHEMA_VERSION} (applied [{applied}])" in result.stdout
    assert task_indexes(sync_engine) == LATEST_INDEXES

    app = Oncely(db_url)

    @app.task
    async def charge(db, order_id: int):  # type: ignore[no-untyped-def]
        pass

    async def enqueue(**kwargs: object):  # type: ignore[no-untyped-def]
        async with AsyncSession(app.store.engine) as db, db.begin():
            return await charge.enqueue(db, **kwargs)

    assert await app.store.schema_version() == SCHEMA_VERSION
    after = {
        r.id: (r.task, r.args, r.state.value, r.idempotency_key) for r in await list_tasks(app)
    }
    assert after == before and len(after) == 4
    # The keys are still unique among retained tasks, whatever their state; tasks without a
    # key are as many as enqueued.
    again = await enqueue(order_id=1, idempotency_key="c:1")
    finished = await enqueue(order_id=2, idempotency_key="c:2")
    assert (again.id, again.duplicate) == (ids["c:1"], True)
    assert (finished.id, finished.duplicate) == (ids["c:2"], True)
    more = await enqueue(order_id=3)
    assert not more.duplicate and more.id not in plain_ids
    # The old rows got v4's defaults: priority 0, no limits, no result; and v9's: no trace.
    assert {(r.priority, r.result) for r in await list_tasks(app)} == {(0, None)}
    with sync_engine.connect() as conn:
        traces = conn.execute(sa.text("SELECT trace_context FROM oncely_tasks")).scalars()
        assert set(traces) == {None}
    with pytest.raises(sa.exc.IntegrityError), sync_engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, "
                "created_at, idempotency_key) SELECT task, queue, args, 'available', 0, run_at, "
                "created_at, idempotency_key FROM oncely_tasks WHERE id = :id"
            ),
            {"id": ids["c:1"]},
        )
    assert len(await list_tasks(app)) == 5
    await app.aclose()
