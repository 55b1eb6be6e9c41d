"""Shared by the tests of schedules kept as data: the schedules app on a migrated test
database, and what the tests count (rows of oncely's tables, effects)."""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa
from tests.support import engine_for, snapshot

from oncely import Oncely

APP = "tests.apps.sched_app"


def fresh_app(db_url: str) -> Oncely:
    """The schedules app, imported anew, on the test database."""
    sys.modules.pop(APP, None)
    module = importlib.import_module(APP)
    app: Oncely = module.app
    app.use_database(db_url)
    return app


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Oncely]:
    """The schedules app on a migrated test database, with its `effects` table."""
    application = fresh_app(db_url)
    await application.migrate()
    async with application.store.transaction() as conn:
        await conn.exec_driver_sql(importlib.import_module(APP).TABLES)
    yield application
    await application.aclose()


def rows(db_url: str, query: str, **params: Any) -> list[tuple[Any, ...]]:
    """The rows of a query, read with plain SQL on a connection of its own."""
    engine = engine_for(db_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(query), params)]
    finally:
        engine.dispose()


def everything(db_url: str) -> dict[str, list[Any]]:
    """Every row of oncely's tables, the schedules' included: to check nothing changed."""
    found = snapshot(db_url)
    found["oncely_schedules"] = sorted(
        tuple(map(str, r)) for r in rows(db_url, "SELECT * FROM oncely_schedules")
    )
    return found


async def until(
    check: Callable[[], Awaitable[bool] | bool], what: str, limit: float = 30.0
) -> None:
    """Poll `check` until it holds, failing after `limit` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = check()
        if not isinstance(found, bool):
            found = await found
        if found:
            return
        await asyncio.sleep(0.05)  # a poll's pause, with a deadline
    raise AssertionError(f"not within {limit}s: {what}")


def migrate(db_url: str) -> None:
    """Create oncely's tables and the app's `effects` on the test database (from sync code)."""

    async def go() -> None:
        application = fresh_app(db_url)
        try:
            await application.migrate()
            async with application.store.transaction() as conn:
                await conn.exec_driver_sql(importlib.import_module(APP).TABLES)
        finally:
            await application.aclose()

    asyncio.run(go())
