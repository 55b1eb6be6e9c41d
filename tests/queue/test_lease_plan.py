"""The work a lease costs the server, whatever the planner knows of the table: counts, not
times.

A lease picks its tasks in lease order, then locks the chosen rows. Right after a burst of
enqueues the table's statistics still describe it as it was (autovacuum's ANALYZE comes
later), and a lease written as `id IN (subquery)` let the planner join every available task
against every chosen one: leasing 500 of 3,000 compared 3,000 x 500 pairs. The lease finds
each chosen row by its key instead, so the rows it touches grow with what it leases.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from queue_helpers import in_tx  # type: ignore[import-not-found]

from oncely import Oncely
from oncely.queue import worker

WAITING = 3000
LEASED = 500


def _visited(node: dict[str, Any]) -> int:
    """The rows every node of a plan produced or threw away, over all its loops."""
    own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Join Filter", 0)) * node.get(
        "Actual Loops", 1
    )
    return int(own) + sum(_visited(child) for child in node.get("Plans", []))


@pytest.mark.postgres
async def test_a_lease_after_a_burst_touches_rows_in_proportion_to_what_it_leases(
    pg_app: Oncely,
) -> None:
    app = pg_app

    @app.task
    async def send(db, n: int):  # type: ignore[no-untyped-def]
        return None

    async with app.store.engine.connect() as conn:
        await conn.execute(sa.text("ANALYZE oncely_tasks"))  # the statistics of an empty table
    await in_tx(app, lambda db: send.enqueue_many(db, [{"n": i} for i in range(WAITING)]))

    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().startswith("WITH free"):
            sent.append((statement, params))

    runner = worker(app, concurrency=1)
    sa.event.listen(app.store.engine.sync_engine, "before_cursor_execute", record)
    try:
        async with app.store.engine.connect() as conn:
            leased = await app.store.tasks.fetch(
                conn, None, LEASED, runner.token(), "A", 30, runner.names
            )
    finally:
        sa.event.remove(app.store.engine.sync_engine, "before_cursor_execute", record)
    assert len(leased) == LEASED
    assert len(sent) == 1

    statement, params = sent[0]
    # The next lease, as the worker would send it, undone.
    async with app.store.engine.connect() as conn, conn.begin() as tx:
        plan = await conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
        (doc,) = plan.scalars().all()
        await tx.rollback()
    root = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]
    assert root["Actual Rows"] == LEASED  # it leased the next 500
    visited = _visited(root)
    # Each leased row is read a handful of times (its scan, the CTEs that carry it, its
    # lookup by key, its update): tens of thousands at most, never WAITING x LEASED.
    assert visited < 40 * LEASED, visited
