"""One attempt is one transaction, whoever sends its statements (guarantees 1 and 2).

On asyncpg oncely begins and ends an attempt's transaction on the driver and the job's session
runs inside it; these tests pin what that must never change: a failed or cancelled attempt's
writes never ride along with a later commit on the same pooled connection, the job's ORM
changes and savepoints land with the claim, and the claim's end is stamped after the job.
Each app here runs every attempt on the previous attempt's connection: a user's engine with a
pool of one connection, or oncely's own engine, which holds a clean attempt's connection for
the next attempt (`store/held.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from oncely import JobTransactionError, Oncely, RunStatus, SchemaMissingError, every
from oncely.store import normalize_url

SLOT = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Base(DeclarativeBase):
    pass


class Coin(Base):
    __tablename__ = "coins"
    member: Mapped[str] = mapped_column(sa.String(20), primary_key=True)


@contextlib.asynccontextmanager
async def one_connection_app(url: str, *, as_is: bool = False) -> AsyncIterator[Oncely]:
    """An app on a pool of one connection; `as_is`: the URL's driver, not oncely's choice."""
    engine = create_async_engine(url if as_is else normalize_url(url), pool_size=1, max_overflow=0)
    app = Oncely(engine)
    try:
        yield await with_coins(app)
    finally:
        await app.aclose()
        await engine.dispose()


@contextlib.asynccontextmanager
async def own_engine_app(url: str) -> AsyncIterator[Oncely]:
    """An app on the engine oncely builds from a URL (on asyncpg it holds attempt connections)."""
    app = Oncely(url)
    try:
        yield await with_coins(app)
    finally:
        await app.aclose()


async def with_coins(app: Oncely) -> Oncely:
    await app.migrate()
    async with app.store.engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    return app


APPS = {"one_connection_pool": one_connection_app, "own_engine": own_engine_app}


@pytest.fixture(params=list(APPS))
async def app(request: pytest.FixtureRequest, db_url: str) -> AsyncIterator[Oncely]:
    async with APPS[request.param](db_url) as app:
        yield app


@pytest.fixture(params=list(APPS))
async def pg_app(request: pytest.FixtureRequest, postgres_database: str) -> AsyncIterator[Oncely]:
    from tests.conftest import _reset_postgres

    _reset_postgres(postgres_database)
    async with APPS[request.param](postgres_database) as app:
        yield app


async def members(app: Oncely) -> list[str]:
    async with app.store.engine.connect() as conn:
        rows = await conn.execute(sa.text("SELECT member FROM coins ORDER BY member"))
        return [r[0] for r in rows]


def insert(member: str) -> sa.TextClause:
    return sa.text(f"INSERT INTO coins (member) VALUES ('{member}')")


async def fail_then_land(app: Oncely) -> None:
    """A job that writes then raises, then one that lands (an ORM object it never flushed)
    on the same pooled connection: only the second one's row and claim exist afterwards."""

    @app.job(every(seconds=1), name="fails")
    async def fails(db, now) -> None:  # type: ignore[no-untyped-def]
        await db.execute(insert("lost"))
        raise RuntimeError("after writing")

    @app.job(every(seconds=1), name="lands")
    async def lands(db, now) -> None:  # type: ignore[no-untyped-def]
        db.add(Coin(member="kept"))

    assert (await app.attempt("fails", now=SLOT)).status is RunStatus.FAILED
    assert (await app.run("lands", now=SLOT)).status is RunStatus.RAN
    assert (await app.run("lands", now=SLOT)).status is RunStatus.SKIPPED
    assert await members(app) == ["kept"]
    claims = await app.history()
    assert [c.job for c in claims] == ["lands"] and claims[0].finished_at is not None


async def test_a_failed_attempts_writes_never_ride_with_the_next_commit(app: Oncely) -> None:
    await fail_then_land(app)


async def test_a_cancelled_attempt_lands_nothing_and_frees_its_connection(app: Oncely) -> None:
    started = asyncio.Event()

    @app.job(every(seconds=1), name="hangs")
    async def hangs(db, now) -> None:  # type: ignore[no-untyped-def]
        await db.execute(insert("lost"))
        started.set()
        await asyncio.Event().wait()

    @app.job(every(seconds=1), name="lands")
    async def lands(db, now) -> None:  # type: ignore[no-untyped-def]
        await db.execute(insert("kept"))

    attempt = asyncio.create_task(app.run("hangs", now=SLOT))
    await asyncio.wait_for(started.wait(), 10)
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    # The one pooled connection is free again, and carries nothing of the cancelled attempt.
    assert (await asyncio.wait_for(app.run("lands", now=SLOT), 10)).status is RunStatus.RAN
    assert await members(app) == ["kept"]
    assert [c.job for c in await app.history()] == ["lands"]  # the cancelled slot is free


async def test_a_session_kept_past_its_attempt_is_refused(app: Oncely) -> None:
    """A job that hands its session to something that outlives it (a task it started):
    the connection moves on to other attempts, so the session must not reach it."""
    kept: list[object] = []

    @app.job(every(seconds=1), name="keeps")
    async def keeps(db, now) -> None:  # type: ignore[no-untyped-def]
        kept.append(db)

    @app.job(every(seconds=1), name="keeps_sync")
    def keeps_sync(db, now) -> None:  # type: ignore[no-untyped-def]
        kept.append(db)

    assert (await app.run("keeps", now=SLOT)).status is RunStatus.RAN
    assert (await app.run("keeps_sync", now=SLOT)).status is RunStatus.RAN
    stale, stale_sync = kept
    with pytest.raises(JobTransactionError, match="attempt that has ended"):
        await stale.execute(insert("stray"))  # type: ignore[attr-defined]
    with pytest.raises(JobTransactionError, match="attempt that has ended"):
        stale_sync.execute(insert("stray"))  # type: ignore[attr-defined]
    assert (await app.run("keeps", now=SLOT + timedelta(seconds=1))).status is RunStatus.RAN
    assert await members(app) == []


async def test_orm_changes_and_savepoints_land_with_the_claim(app: Oncely) -> None:
    @app.job(every(seconds=1), name="orm")
    async def orm(db, now) -> None:  # type: ignore[no-untyped-def]
        db.add(Coin(member="added"))  # never flushed by the job
        try:
            async with db.begin_nested():
                await db.execute(insert("undone"))
                raise LookupError("roll back to the savepoint only")
        except LookupError:
            pass
        await db.execute(insert("plain"))

    assert (await app.run("orm", now=SLOT)).status is RunStatus.RAN
    assert await members(app) == ["added", "plain"]


async def test_sync_job_orm_changes_land_with_the_claim(app: Oncely) -> None:
    @app.job(every(seconds=1), name="sync_orm")
    def sync_orm(db, now) -> None:  # type: ignore[no-untyped-def]
        db.add(Coin(member="sync"))

    assert (await app.run("sync_orm", now=SLOT)).status is RunStatus.RAN
    assert (await app.run("sync_orm", now=SLOT)).status is RunStatus.SKIPPED
    assert await members(app) == ["sync"]


async def test_the_claims_end_is_stamped_after_the_job(app: Oncely) -> None:
    @app.job(every(seconds=1), name="slow")
    async def slow(db, now) -> None:  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.05)  # the work takes this long; not a synchronization

    for second in range(2):
        result = await app.run("slow", now=SLOT + timedelta(seconds=second))
        assert result.status is RunStatus.RAN
    claims = await app.history("slow")
    assert len(claims) == 2
    for claim in claims:
        assert claim.finished_at is not None and claim.duration is not None
        assert claim.duration >= 0.05


@pytest.mark.postgres
async def test_a_job_that_hides_a_database_error_still_fails(pg_app: Oncely) -> None:
    """On Postgres an error aborts the transaction; swallowing it must not commit half."""

    @pg_app.job(every(seconds=1), name="hides")
    async def hides(db, now) -> None:  # type: ignore[no-untyped-def]
        await db.execute(insert("before"))
        with contextlib.suppress(sa.exc.ProgrammingError):
            await db.execute(sa.text("SELECT * FROM no_such_table"))

    result = await pg_app.attempt("hides", now=SLOT)
    assert result.status is RunStatus.FAILED
    assert await members(pg_app) == []
    assert await pg_app.history() == []


@pytest.mark.postgres
async def test_a_connection_checked_in_mid_transaction_is_replaced(pg_app: Oncely) -> None:
    """A transaction opened on the driver and left open is rolled back, not inherited."""

    @pg_app.job(every(seconds=1), name="lands")
    async def lands(db, now) -> None:  # type: ignore[no-untyped-def]
        await db.execute(insert("kept"))

    engine = pg_app.store.engine
    async with engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        await driver.execute("BEGIN")  # behind SQLAlchemy's back
        await driver.execute("INSERT INTO coins (member) VALUES ('ghost')")
    assert driver.is_closed()  # closed on checkin: the server rolled the transaction back
    assert (await pg_app.run("lands", now=SLOT)).status is RunStatus.RAN
    assert await members(pg_app) == ["kept"]


async def test_tables_dropped_under_a_running_app_name_the_fix(app: Oncely) -> None:
    @app.job(every(seconds=1), name="tick")
    async def tick(db, now) -> None:  # type: ignore[no-untyped-def]
        return None

    assert (await app.run("tick", now=SLOT)).status is RunStatus.RAN  # schema checked once
    async with app.store.engine.begin() as conn:
        await conn.exec_driver_sql("DROP TABLE oncely_runs")
    with pytest.raises(SchemaMissingError, match="oncely migrate"):
        await app.run("tick", now=SLOT + timedelta(seconds=1))


@pytest.mark.postgres
async def test_another_async_driver_keeps_sqlalchemys_transaction(postgres_database: str) -> None:
    """With psycopg instead of asyncpg, SQLAlchemy runs the attempt's transaction: the same
    outcomes, the same one effect."""
    from sqlalchemy.engine import make_url
    from tests.conftest import _reset_postgres

    _reset_postgres(postgres_database)
    url = make_url(postgres_database).set(drivername="postgresql+psycopg")
    async with one_connection_app(url.render_as_string(hide_password=False), as_is=True) as app:
        assert app.store.engine.dialect.driver == "psycopg"
        await fail_then_land(app)
