"""The testing toolkit with an app built on an engine (`Oncely(engine)`, the FastAPI pattern):
`using_database` keeps the engine for its own database and refuses another one by name;
`prepare_database` cleans the database an app really uses."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from oncely import Oncely, cron
from oncely.errors import ConfigError
from oncely.testing import JobSlot, deliver_twice, prepare_database, using_database

FRIDAY = datetime.fromisoformat("2026-11-27T18:00:00-06:00")


def async_url(url: str) -> str:
    parsed = make_url(url)
    driver = "sqlite+aiosqlite" if parsed.get_backend_name() == "sqlite" else "postgresql+asyncpg"
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def engine_app(engine: AsyncEngine) -> Oncely:
    app = Oncely(engine)

    @app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
    async def close(db, now):  # type: ignore[no-untyped-def]
        await db.execute(sa.text("INSERT INTO closes (slot) VALUES (:s)"), {"s": now.isoformat()})

    return app


async def closes(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(sa.text("SELECT count(*) FROM closes"))).scalar_one())


@pytest.fixture
async def app_engine(db_url: str) -> AsyncEngine:
    engine = create_async_engine(async_url(db_url))
    async with engine.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE closes (slot varchar(64))"))
    yield engine  # type: ignore[misc]
    await engine.dispose()


async def test_a_url_of_another_database_is_refused_naming_both(
    app_engine: AsyncEngine, tmp_path: Path
) -> None:
    app = engine_app(app_engine)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    with pytest.raises(ConfigError) as caught:
        async with using_database(app, other):
            pass
    message = str(caught.value)
    assert "the app is built on an engine for " in message
    assert app_engine.url.render_as_string(hide_password=True) in message
    assert "other.db" in message and "using_database(app, engine)" in message
    assert app._database is app_engine and app._store is None  # nothing changed


async def test_the_same_database_keeps_the_apps_engine_and_counts_once(
    app_engine: AsyncEngine, db_url: str
) -> None:
    app = engine_app(app_engine)
    await prepare_database(app)  # the database the app uses: its engine's
    async with using_database(app, db_url) as same:
        assert same.store.engine is app_engine
        result = await deliver_twice(
            JobSlot(same, "close", FRIDAY), concurrently=True, effects=lambda: closes(app_engine)
        )  # an async effects counter
        result.assert_once()
    assert await closes(app_engine) == 1
    async with app_engine.connect() as conn:  # the user's engine is still open
        assert (await conn.execute(sa.text("SELECT 1"))).scalar_one() == 1


async def test_a_sessionmaker_app_and_an_engine_argument(app_engine: AsyncEngine) -> None:
    app = Oncely(async_sessionmaker(app_engine))
    await prepare_database(app_engine)
    async with using_database(app, app_engine) as pointed:
        assert pointed.store.engine is app_engine


async def test_prepare_database_empties_the_ledger_of_the_apps_engine(
    app_engine: AsyncEngine,
) -> None:
    app = engine_app(app_engine)
    await app.migrate()
    assert (await app.run("close", FRIDAY)).status.value == "ran"
    await app.aclose()
    await prepare_database(app)
    assert (await app.run("close", FRIDAY)).status.value == "ran"  # the claim was deleted
    await app.aclose()


async def test_every_delivery_skipped_says_the_ledger_was_not_empty(
    app_engine: AsyncEngine,
) -> None:
    app = engine_app(app_engine)
    await app.migrate()
    await app.run("close", FRIDAY)  # a claim left from an earlier run
    result = await deliver_twice(JobSlot(app, "close", FRIDAY), effects=lambda: closes(app_engine))
    with pytest.raises(AssertionError, match="claimed before the test"):
        result.assert_once()
    await app.aclose()
