"""Issue 15: `oncely tasks cancel ID` of a running task stops it in the worker that runs it:
its transaction rolls back, it ends discarded (no retry), within seconds. Both databases, a
real worker in this process, the cancel from the app's API (what the CLI calls)."""

from __future__ import annotations

import asyncio
import time

import sqlalchemy as sa
from queue_helpers import drain, effects, in_tx  # type: ignore[import-not-found]

from oncely import Oncely, TaskState

INSERT = sa.text("INSERT INTO effects (n) VALUES (:n)")


async def test_cancel_of_a_running_task_rolls_it_back_and_discards_it(app: Oncely) -> None:
    started = asyncio.Event()

    @app.task
    async def call_forever(db, n: int):  # type: ignore[no-untyped-def]
        started.set()
        await asyncio.Event().wait()  # an HTTP call that never answers
        await db.execute(INSERT, {"n": n})

    @app.task
    async def record(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    rec = await in_tx(app, lambda db: call_forever.enqueue(db, n=1))
    asked_at: list[float] = []

    async def done() -> bool:
        if started.is_set() and not asked_at:
            answer, _ = await app.cancel_task(rec.id, actor="test", reason="stuck")
            assert answer == "cancel requested"
            asked_at.append(time.monotonic())
            await in_tx(app, lambda db: record.enqueue(db, n=2))  # the worker goes on
        task = await app.task_record(rec.id)
        return task.state is TaskState.DISCARDED and await effects(app) == [2]

    await drain(app, done, timeout=60)
    assert time.monotonic() - asked_at[0] < 30
    task = await app.task_record(rec.id)
    assert task.attempt == 1
    assert task.error is not None and "TaskCancelledError" in task.error
    assert (await app.task_errors(rec.id)).errors == []  # a cancel is no failed attempt
    assert await effects(app) == [2]  # the cancelled task's work never landed
    audit = [e for e in await app.audit() if e.action == "task_cancel"]
    assert [e.target for e in audit] == [f"task {rec.id}"]
