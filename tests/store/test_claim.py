"""The claim primitive and the ledger, on SQLite and Postgres (guarantees 1, 2, 8)."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

from oncely import Oncely, SchemaMissingError, claim_run, claim_run_sync
from oncely.schema import SCHEMA_VERSION
from oncely.store import normalize_url
from oncely.store.migrations import applied_from

WORK = "CREATE TABLE work (note varchar(50))"


@pytest.fixture
async def sessions(db_url: str):  # type: ignore[no-untyped-def]
    app = Oncely(db_url)
    await app.migrate()
    await app.aclose()
    engine = create_async_engine(normalize_url(db_url))
    async with engine.begin() as conn:
        await conn.exec_driver_sql(WORK)
    yield async_sessionmaker(engine, expire_on_commit=False)
    await engine.dispose()


async def count(maker: async_sessionmaker[AsyncSession], table: str) -> int:
    async with maker() as s:
        return int((await s.execute(sa.text(f"SELECT count(*) FROM {table}"))).scalar_one())


async def test_claim_is_true_once_then_false(sessions) -> None:  # type: ignore[no-untyped-def]
    async with sessions() as s, s.begin():
        assert await claim_run(s, "leaderboard_close", "2026-W48") is True
    async with sessions() as s, s.begin():
        assert await claim_run(s, "leaderboard_close", "2026-W48") is False
        # Another key, or the same key of another job, is a different claim.
        assert await claim_run(s, "leaderboard_close", "2026-W49") is True
        assert await claim_run(s, "weekly_digest", "2026-W48") is True
    assert await count(sessions, "oncely_runs") == 3


async def test_failure_frees_the_slot_rollback_releases_the_claim(sessions) -> None:  # type: ignore[no-untyped-def]
    """The seed article's regression test: a rolled-back attempt leaves no claim, no work."""
    async with sessions() as s, s.begin():
        assert await claim_run(s, "leaderboard_close", "2026-W48") is True
        await s.execute(sa.text("INSERT INTO work VALUES ('paid')"))
        await s.rollback()
    assert await count(sessions, "oncely_runs") == 0
    assert await count(sessions, "work") == 0
    async with sessions() as s, s.begin():
        assert await claim_run(s, "leaderboard_close", "2026-W48") is True
        await s.execute(sa.text("INSERT INTO work VALUES ('paid')"))
    assert await count(sessions, "work") == 1


def test_claim_run_sync_on_a_plain_session(db_url: str, sync_engine: sa.Engine) -> None:
    asyncio.run(Oncely(db_url).migrate())
    with Session(sync_engine) as s, s.begin():
        assert claim_run_sync(s, "nightly", "2026-11-29") is True
    with Session(sync_engine) as s, s.begin():
        assert claim_run_sync(s, "nightly", "2026-11-29") is False
        assert claim_run_sync(s, "nightly", "2026-11-30") is True
        s.rollback()
    with Session(sync_engine) as s, s.begin():
        assert claim_run_sync(s, "nightly", "2026-11-30") is True


async def test_claim_before_migrate_names_the_fix(db_url: str) -> None:
    engine = create_async_engine(normalize_url(db_url))
    try:
        async with AsyncSession(engine) as s, s.begin():
            with pytest.raises(SchemaMissingError, match="oncely migrate"):
                await claim_run(s, "job", "key")
    finally:
        await engine.dispose()


async def test_migrate_is_idempotent_and_versioned(db_url: str) -> None:
    apps = [Oncely(db_url) for _ in range(3)]
    results = await asyncio.gather(*(a.migrate() for a in apps), return_exceptions=True)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sorted(map(tuple, results)) == [(), (), tuple(applied_from(1))]  # type: ignore[arg-type]
    assert await apps[0].store.schema_version() == SCHEMA_VERSION
    assert await apps[0].migrate() == []
    for app in apps:
        await app.aclose()


async def test_schema_metadata_is_exposed_for_alembic() -> None:
    from oncely.schema import metadata

    assert {"oncely_runs", "oncely_schema"} <= set(metadata.tables)
    runs = metadata.tables["oncely_runs"]
    assert [c.name for c in runs.primary_key.columns] == ["job", "key"]
    assert {"scheduled_for", "claimed_at", "claimed_by", "finished_at"} <= set(runs.c.keys())


async def test_claim_run_on_an_async_connection(sessions) -> None:  # type: ignore[no-untyped-def]
    engine = sessions.kw["bind"]
    async with engine.begin() as conn:
        assert await claim_run(conn, "core", "k1") is True
        assert await claim_run(conn, "core", "k1") is False  # the same transaction's claim
    async with engine.connect() as conn:
        assert await claim_run(conn, "core", "k2") is True
        await conn.rollback()
    async with engine.begin() as conn:
        assert await claim_run(conn, "core", "k1") is False
        assert await claim_run(conn, "core", "k2") is True  # the rollback freed it
    assert await count(sessions, "oncely_runs") == 2


def test_claim_run_sync_on_a_plain_connection(db_url: str, sync_engine: sa.Engine) -> None:
    asyncio.run(Oncely(db_url).migrate())
    with sync_engine.begin() as conn:
        assert claim_run_sync(conn, "core_sync", "k") is True
    with sync_engine.begin() as conn:
        assert claim_run_sync(conn, "core_sync", "k") is False


@pytest.fixture
async def asyncpg_conn(postgres_database: str):  # type: ignore[no-untyped-def]
    import asyncpg
    from tests.conftest import _reset_postgres

    _reset_postgres(postgres_database)
    conn = await asyncpg.connect(postgres_database)
    yield conn
    await conn.close()


@pytest.mark.postgres
async def test_claim_run_on_a_bare_asyncpg_connection(postgres_database: str, asyncpg_conn) -> None:  # type: ignore[no-untyped-def]
    await Oncely(postgres_database).migrate()
    conn = asyncpg_conn
    await conn.execute(WORK)
    async with conn.transaction():
        assert await claim_run(conn, "raw", "2026-W48") is True
        await conn.execute("INSERT INTO work VALUES ('paid')")
    tr = conn.transaction()
    await tr.start()
    assert await claim_run(conn, "raw", "2026-W48") is False
    assert await claim_run(conn, "raw", "2026-W49") is True
    await conn.execute("INSERT INTO work VALUES ('paid twice')")
    await tr.rollback()  # frees W49, and its work goes with it
    async with conn.transaction():
        assert await claim_run(conn, "raw", "2026-W49") is True
    rows = await conn.fetch("SELECT key, claimed_by FROM oncely_runs ORDER BY key")
    assert [r["key"] for r in rows] == ["2026-W48", "2026-W49"]
    assert all(r["claimed_by"].endswith(f":{__import__('os').getpid()}") for r in rows)
    assert await conn.fetchval("SELECT count(*) FROM work") == 1


@pytest.mark.postgres
async def test_claim_run_refuses_an_asyncpg_connection_outside_a_transaction(
    postgres_database: str,
    asyncpg_conn,  # type: ignore[no-untyped-def]
) -> None:
    """Outside a transaction the claim would commit apart from the work: refused, not sent."""
    from oncely import BadInputError

    await Oncely(postgres_database).migrate()
    with pytest.raises(BadInputError, match=r"conn\.transaction\(\)"):
        await claim_run(asyncpg_conn, "raw", "k")
    assert await asyncpg_conn.fetchval("SELECT count(*) FROM oncely_runs") == 0


@pytest.mark.postgres
async def test_claim_run_on_asyncpg_before_migrate_names_the_fix(asyncpg_conn) -> None:  # type: ignore[no-untyped-def]
    async with asyncpg_conn.transaction():
        with pytest.raises(SchemaMissingError, match="oncely migrate"):
            await claim_run(asyncpg_conn, "raw", "k")
