"""Fixtures of the store's contract suites: a migrated store on each test database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from oncely.store import Store


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    """A migrated store on the test database (each of them)."""
    store = Store.from_url(db_url)
    await store.migrate()
    try:
        yield store
    finally:
        await store.dispose()


@pytest.fixture
async def pg_store(postgres_database: str) -> AsyncIterator[Store]:
    """`store` on Postgres alone, for what only Postgres has (row and advisory locks that
    others skip, concurrent leasers)."""
    from tests.conftest import _reset_postgres

    _reset_postgres(postgres_database)
    store = Store.from_url(postgres_database)
    await store.migrate()
    try:
        yield store
    finally:
        await store.dispose()
