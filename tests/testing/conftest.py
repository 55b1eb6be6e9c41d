"""The shop app pointed at the test database (in this process and in child processes)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from tests.apps import shop

from oncely import Oncely
from oncely.testing import FakeProvider, using_database


@pytest.fixture
async def shop_app(
    db_url: str,
    sync_engine: sa.Engine,
    fake_provider: FakeProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Oncely]:
    monkeypatch.setenv("ONCELY_DATABASE_URL", db_url)
    async with using_database(shop.app, db_url) as app:
        await app.migrate()
        with sync_engine.begin() as conn:
            conn.exec_driver_sql(shop.SHOP_TABLES)
        yield app
