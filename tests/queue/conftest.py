"""Fixtures for the task queue's tests: a migrated app per database, recorded events."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy as sa
from queue_helpers import EFFECTS_DDL, Events  # type: ignore[import-not-found]

from oncely import Oncely


@contextlib.asynccontextmanager
async def queue_app(url: str) -> AsyncIterator[Oncely]:
    """An app on `url`, migrated, with an empty `effects` table."""
    oncely = Oncely(url, lease=5)
    await oncely.migrate()
    async with oncely.store.engine.begin() as conn:
        await conn.execute(sa.text(EFFECTS_DDL))
    try:
        yield oncely
    finally:
        await oncely.aclose()


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Oncely]:
    """An app on the test database (each of them), migrated, with an empty `effects` table."""
    async with queue_app(db_url) as oncely:
        yield oncely


@pytest.fixture
async def pg_app(postgres_database: str) -> AsyncIterator[Oncely]:
    """`app` on Postgres alone, for what only Postgres can show (its wire, its many writers)."""
    from tests.conftest import _reset_postgres

    _reset_postgres(postgres_database)
    async with queue_app(postgres_database) as oncely:
        yield oncely


@pytest.fixture
def recorded() -> Any:
    from oncely import events

    rec = Events()
    events.subscribe(rec)
    yield rec
    events.unsubscribe(rec)
