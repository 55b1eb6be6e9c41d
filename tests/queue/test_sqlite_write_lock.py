"""Issue 13, item 6: on SQLite a task takes the write lock at its first write, not at its
start, so the app's own writes go through at once while a task awaits before writing; a task
whose deferred transaction read, then met another writer, runs again at once, its attempt not
counted. Real SQLite files, a real worker in this process, the app's writes on their own
connection."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from queue_helpers import EFFECTS_DDL, drain, effects, in_tx  # type: ignore[import-not-found]

from oncely import Oncely

INSERT = sa.text("INSERT INTO effects (n) VALUES (:n)")


@pytest.fixture
async def lite(tmp_path: Path):  # type: ignore[no-untyped-def]
    """An app on a SQLite file of its own, migrated, with an empty `effects` table."""
    path = tmp_path / "oncely.db"
    app = Oncely(f"sqlite:///{path}", lease=5)
    await app.migrate()
    async with app.store.engine.begin() as conn:
        await conn.execute(sa.text(EFFECTS_DDL))
    try:
        yield app, path
    finally:
        await app.aclose()


def app_write(path: Path, n: int, busy_ms: int = 200) -> float:
    """The app's own INSERT on a connection of its own, waiting at most `busy_ms` for the
    write lock; the seconds it took (sqlite3.OperationalError if the lock stayed taken)."""
    started = time.monotonic()
    conn = sqlite3.connect(path, timeout=busy_ms / 1000, isolation_level=None)
    try:
        conn.execute("INSERT INTO effects (n) VALUES (?)", (n,))
    finally:
        conn.close()
    return time.monotonic() - started


async def test_the_apps_writes_go_through_while_a_task_awaits_before_writing(lite) -> None:  # type: ignore[no-untyped-def]
    app, path = lite
    awaiting, go = asyncio.Event(), asyncio.Event()

    @app.task
    async def call_then_write(db, n: int):  # type: ignore[no-untyped-def]
        awaiting.set()
        await go.wait()  # an HTTP call, say
        await db.execute(INSERT, {"n": n})

    await in_tx(app, lambda db: call_then_write.enqueue(db, n=1))

    async def scenario() -> bool:
        await asyncio.wait_for(awaiting.wait(), 30)
        # While the task awaits: the app's INSERT and an enqueue, each at once (200 ms busy
        # timeout: with the write lock taken they would fail with "database is locked").
        took = await asyncio.to_thread(app_write, path, 100)
        await in_tx(app, lambda db: call_then_write.enqueue(db, n=2, run_at=_later()))
        go.set()
        return took < 0.2

    result: list[bool] = []

    async def done() -> bool:
        if not result:
            result.append(await scenario())
        return await effects(app) == [1, 100]

    await drain(app, done)
    assert result == [True]


async def test_a_task_that_read_then_met_another_writer_runs_again_uncounted(
    lite,
    recorded,  # type: ignore[no-untyped-def]
) -> None:
    """The task reads, awaits, then writes; meanwhile the app commits a write. SQLite refuses
    the task's write (SQLITE_BUSY_SNAPSHOT: its snapshot is stale). The worker rolls the
    attempt back and runs it again at once, locking first: two body calls, one attempt, one
    effect of the task, and the task succeeded."""
    app, path = lite
    calls: list[int] = []
    awaiting, go = asyncio.Event(), asyncio.Event()

    @app.task
    async def read_call_write(db, n: int):  # type: ignore[no-untyped-def]
        calls.append(n)
        seen = (await db.execute(sa.text("SELECT count(*) FROM effects"))).scalar_one()
        awaiting.set()
        await go.wait()
        await db.execute(INSERT, {"n": n + seen})

    rec = await in_tx(app, lambda db: read_call_write.enqueue(db, n=10))

    async def done() -> bool:
        if not go.is_set() and awaiting.is_set():
            await asyncio.to_thread(app_write, path, 1)  # commits after the task's read
            go.set()
        return len(await effects(app)) == 2

    await drain(app, done)
    assert calls == [10, 10]
    assert await effects(app) == [1, 11]  # the second run read the app's row
    (task,) = [r for r in await app_tasks(app) if r.id == rec.id]
    assert (task.state.value, task.attempt) == ("succeeded", 1)
    assert [e["id"] for e in recorded.named("task.conflict")] == [rec.id]
    assert recorded.named("task.retry") == []


async def app_tasks(app: Oncely):  # type: ignore[no-untyped-def]
    from oncely.queue import list_tasks

    return await list_tasks(app)


def _later():  # type: ignore[no-untyped-def]
    from datetime import datetime, timedelta, timezone

    return datetime.now(timezone.utc) + timedelta(hours=1)
