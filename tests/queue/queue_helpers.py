"""Helpers for the task queue's tests: effects, one-off transactions, a drain loop, events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from oncely import Oncely
from oncely.queue import consume

EFFECTS_DDL = "CREATE TABLE effects (n integer NOT NULL, pid integer NOT NULL DEFAULT 0)"


async def effects(app: Oncely) -> list[int]:
    """The `n` of every effect row, sorted."""
    async with app.store.engine.connect() as conn:
        rows = await conn.execute(sa.text("SELECT n FROM effects ORDER BY n"))
        return [r[0] for r in rows]


async def all_ended(app: Oncely) -> bool:
    """Whether no task is left available or running."""
    async with app.store.engine.connect() as conn:
        left = await conn.scalar(
            sa.text("SELECT count(*) FROM oncely_tasks WHERE state IN ('available', 'running')")
        )
        return left == 0


async def in_tx(app: Oncely, work: Callable[[AsyncSession], Awaitable[Any]]) -> Any:
    """Run `work(db)` in a transaction of its own, committed."""
    async with AsyncSession(app.store.engine) as db, db.begin():
        return await work(db)


async def drain(
    app: Oncely,
    done: Callable[[], Awaitable[bool]],
    *,
    timeout: float = 30,
    **options: Any,
) -> None:
    """Run a worker until `done()` holds (checked every 20 ms), then stop it cleanly."""
    stopping = asyncio.Event()
    options.setdefault("poll", 0.05)
    worker = asyncio.create_task(consume(app, stopping, **options))
    deadline = time.monotonic() + timeout
    try:
        while not await done():
            if worker.done():
                worker.result()
                raise AssertionError("the worker stopped on its own")
            if time.monotonic() > deadline:
                raise AssertionError(f"not done within {timeout}s")
            await asyncio.sleep(0.02)
    finally:
        stopping.set()
        await asyncio.wait_for(worker, 30)


class Events:
    """Records oncely events (name, fields) while subscribed."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, fields: Any) -> None:
        self.seen.append((event, dict(fields)))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.seen if name == event]
