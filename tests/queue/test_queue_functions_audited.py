"""The 0.1.0 functions of `oncely.queue` are operator actions like `Oncely`'s own: retry,
discard and prune each leave one audit row, written in the action's transaction."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from queue_helpers import drain, in_tx  # type: ignore[import-not-found]

from oncely import Oncely, RetryPolicy, TaskState
from oncely.queue import discard_task, prune, retry_task


async def trail(app: Oncely) -> list[tuple[str, str, str]]:
    """The audit rows, oldest first: (action, target, result)."""
    async with app.store.engine.connect() as conn:
        rows = await conn.execute(
            sa.text("SELECT action, target, result FROM oncely_audit ORDER BY id")
        )
        return [(r[0], r[1], r[2]) for r in rows]


async def test_retry_discard_and_prune_each_write_their_audit_row(app: Oncely) -> None:
    @app.task(retry=RetryPolicy(attempts=1))
    async def fragile(db, n: int):  # type: ignore[no-untyped-def]
        raise RuntimeError("always")

    dead = await in_tx(app, lambda db: fragile.enqueue(db, n=1))
    waiting = await in_tx(app, lambda db: fragile.enqueue(db, n=2, delay=3600))

    async def one_dead() -> bool:
        return [r.id for r in await app.list_tasks(TaskState.DEAD)] == [dead.id]

    await drain(app, one_dead)
    assert await trail(app) == []

    assert (await retry_task(app, dead.id)).state is TaskState.AVAILABLE
    assert await trail(app) == [("task_retry", f"task {dead.id}", "available now")]

    assert (await discard_task(app, waiting.id)).state is TaskState.DISCARDED
    assert (await trail(app))[1:] == [("task_discard", f"task {waiting.id}", "discarded")]

    finished = (await app.task_record(waiting.id)).finished_at
    assert finished is not None
    assert await prune(app, timedelta(seconds=1), now=finished + timedelta(seconds=2)) == (1, 0)
    (action, target, result) = (await trail(app))[2]
    assert (action, target) == ("prune", "older than 1s")
    assert result.startswith("1 tasks, 0 claims, ")
    assert len(await trail(app)) == 3
