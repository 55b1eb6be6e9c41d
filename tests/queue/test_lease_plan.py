"""The work a lease costs the server, whatever the planner knows of the table: counts, not
times.

A lease picks its tasks in lease order, then locks the chosen rows. Right after a burst of
enqueues the table's statistics still describe it as it was (autovacuum's ANALYZE comes
later), and a lease written as `id IN (subquery)` let the planner join every available task
against every chosen one: leasing 500 of 3,000 compared 3,000 x 500 pairs. The lease finds
each chosen row by its key instead, so the rows it touches grow with what it leases.

Tasks scheduled for later (a backlog of delayed work) are not due: a lease must not read
them one by one to find that out. Compared with `clock_timestamp()`, which no index scan can
start from, the planner read every available task, 100,000 of them per lease on a filled
table (bench/table_growth.py's drain at 63 tasks/s against 296 on empty tables); compared
with the statement's own time, the scan starts and ends at the due ones.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from queue_helpers import in_tx  # type: ignore[import-not-found]

from oncely import Oncely
from oncely.queue import worker
from oncely.work.tasks import TaskWorker

WAITING = 3000
LEASED = 500
BACKLOG = """
    INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, created_at)
    SELECT 'report_' || (i % 20), 'default', '{}', 'available', 0,
           now() + make_interval(days => 30, secs => i), now()
    FROM generate_series(1, :n) AS i
"""
FINISHED = """
    INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, created_at, finished_at)
    SELECT 'send', 'default', '{}', 'succeeded', 1, now(), now(), now()
    FROM generate_series(1, :n) AS i
"""


def _visited(node: dict[str, Any]) -> int:
    """The rows every node of a plan produced or threw away, over all its loops."""
    kept = node.get("Actual Rows", 0)
    removed = node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Join Filter", 0)
    own = (kept + removed) * node.get("Actual Loops", 1)
    return int(own) + sum(_visited(child) for child in node.get("Plans", []))


async def explained_lease(app: Oncely, runner: TaskWorker, limit: int) -> tuple[int, int, int]:
    """Lease up to `limit` tasks as a worker does, then the next lease once more under
    EXPLAIN ANALYZE, undone: (how many the first took, how many the second took, the rows
    the second's plan read)."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().startswith("WITH free"):
            sent.append((statement, params))

    sa.event.listen(app.store.engine.sync_engine, "before_cursor_execute", record)
    try:
        async with app.store.engine.connect() as conn:
            leased = await app.store.tasks.fetch(
                conn, None, limit, runner.token(), "A", 30, runner.names
            )
    finally:
        sa.event.remove(app.store.engine.sync_engine, "before_cursor_execute", record)
    assert len(sent) == 1
    statement, params = sent[0]
    async with app.store.engine.connect() as conn, conn.begin() as tx:
        plan = await conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
        (doc,) = plan.scalars().all()
        await tx.rollback()
    root = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]
    return len(leased), int(root["Actual Rows"]), _visited(root)


async def analyzed_then_enqueued(app: Oncely, due: int, backlog: int = 0) -> TaskWorker:
    """`backlog` tasks of other names due in 30 days, the table ANALYZEd (what autovacuum
    would know), then `due` tasks of this app's one task enqueued; a worker of this app."""

    @app.task
    async def send(db, n: int):  # type: ignore[no-untyped-def]
        return None

    async with app.store.engine.begin() as conn:
        if backlog:
            await conn.execute(sa.text(BACKLOG), {"n": backlog})
        await conn.execute(sa.text("ANALYZE oncely_tasks"))
    await in_tx(app, lambda db: send.enqueue_many(db, [{"n": i} for i in range(due)]))
    return worker(app, concurrency=1)


@pytest.mark.postgres
async def test_a_lease_reads_the_due_tasks_not_the_backlog_scheduled_for_later(
    pg_app: Oncely,
) -> None:
    # A backlog of other workers' tasks (names this worker does not run), then 200 due.
    runner = await analyzed_then_enqueued(pg_app, 200, backlog=20_000)
    took, _, visited = await explained_lease(pg_app, runner, 100)
    assert took == 100
    assert visited < 40 * 100, visited  # the next 100 due ones, not the 20,000 others
    took, leased_next, visited = await explained_lease(pg_app, runner, 100)
    assert (took, leased_next) == (100, 0)
    assert visited < 500, visited  # nothing is due any more: the scan ends at once


@pytest.mark.postgres
async def test_a_lease_after_a_burst_touches_rows_in_proportion_to_what_it_leases(
    pg_app: Oncely,
) -> None:
    app = pg_app
    runner = await analyzed_then_enqueued(app, WAITING)  # the statistics of an empty table
    took, leased_next, visited = await explained_lease(app, runner, LEASED)
    assert took == LEASED
    assert leased_next == LEASED  # the explained lease took the next 500
    # Each leased row is read a handful of times (its scan, the CTEs that carry it, its
    # lookup by key, its update): tens of thousands at most, never WAITING x LEASED.
    assert visited < 40 * LEASED, visited


@pytest.mark.postgres
async def test_a_worker_plans_its_lease_once_per_connection_not_at_every_call(
    pg_app: Oncely,
) -> None:
    """Postgres plans a prepared statement's first five runs with their values, then keeps
    one generic plan if it costs no more. The lease's states are written in its text: sent
    as parameters they kept the partial indexes out of the generic plan, and every lease was
    planned again (2 ms, five times its run on a small table)."""
    assert pg_app.store.engine.dialect.driver == "asyncpg"  # its prepared statements
    # A table as a worker meets it: finished tasks, and some scheduled for later.
    async with pg_app.store.engine.begin() as conn:
        await conn.execute(sa.text(FINISHED), {"n": 2_000})
    runner = await analyzed_then_enqueued(pg_app, 0, backlog=500)
    control = pg_app.store.dialect.autocommit(pg_app.store.engine)
    async with control.connect() as conn:
        for _ in range(8):
            leased = await pg_app.store.tasks.fetch(
                conn, None, 10, runner.token(), "A", 30, runner.names
            )
            assert leased == []
        plans = (
            await conn.exec_driver_sql(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE 'WITH free%'"
            )
        ).all()
    assert len(plans) == 1, plans
    generic, custom = plans[0]
    assert custom == 5 and generic == 3, plans
