"""Pointing an app at a test database, and getting one ready."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ..app import Database, Oncely


@asynccontextmanager
async def using_database(app: Oncely, database: Database) -> AsyncIterator[Oncely]:
    """Point a (module-level) app at a test database for the block, then put it back.

    Closes the pool the app opened on the test database when the block ends, so each test
    can hand the same app a fresh database. The schema is not created: `await app.migrate()`.
    """
    saved_database, saved_store = app._database, app._store
    app._database, app._store = database, None
    try:
        yield app
    finally:
        await app.aclose()
        app._database, app._store = saved_database, saved_store


async def prepare_database(url: str) -> None:
    """Create oncely's tables in `url` if missing; delete every claim and task (a clean ledger)."""
    app = Oncely(url)
    try:
        await app.migrate()
        await app.store.clear()
    finally:
        await app.aclose()
