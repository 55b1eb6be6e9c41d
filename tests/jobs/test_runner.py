"""`app.run` in one process: statuses, transactions, sync jobs, engines (guarantees 1, 2, 4)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

from oncely import (
    JobTransactionError,
    Oncely,
    RunStatus,
    SchemaMissingError,
    cron,
    every,
)
from oncely.store import normalize_url

MX = ZoneInfo("America/Mexico_City")
FRIDAY = datetime(2026, 11, 27, 18, 0, tzinfo=MX)


@pytest.fixture
async def app(db_url: str):  # type: ignore[no-untyped-def]
    app = Oncely(db_url)
    await app.migrate()
    async with app.store.engine.begin() as conn:
        await conn.exec_driver_sql("CREATE TABLE coins (member varchar(20), slot varchar(40))")
    yield app
    await app.aclose()


async def coins(app: Oncely) -> list[tuple[str, str]]:
    async with app.store.engine.connect() as conn:
        rows = await conn.execute(sa.text("SELECT member, slot FROM coins ORDER BY member"))
        return [tuple(r) for r in rows]  # type: ignore[misc]


async def test_async_job_runs_once_and_gets_the_slot_in_its_zone(app: Oncely, caplog) -> None:  # type: ignore[no-untyped-def]
    seen: list[tuple[type, datetime]] = []

    @app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
    async def close(db, now):  # type: ignore[no-untyped-def]
        seen.append((type(db), now))
        await db.execute(sa.text("INSERT INTO coins VALUES ('ana', :s)"), {"s": now.isoformat()})

    first = await app.run("close", FRIDAY.replace(minute=1))
    assert first.status is RunStatus.RAN and first.key == "2026-11-28T00:00:00Z"
    with caplog.at_level(logging.INFO, logger="oncely"):
        second = await app.run("close", FRIDAY.replace(minute=2))
    assert second.status is RunStatus.SKIPPED
    assert second.claim is not None and second.claim.claimed_by.endswith(
        ":" + str(__import__("os").getpid())
    )
    assert seen == [(AsyncSession, FRIDAY)] and seen[0][1].tzinfo == MX
    assert await coins(app) == [("ana", "2026-11-27T18:00:00-06:00")]
    skipped = [r for r in caplog.records if getattr(r, "event", "") == "run.skipped"]
    assert len(skipped) == 1 and skipped[0].levelno == logging.INFO
    assert "already ran, skipping" in skipped[0].getMessage()
    assert skipped[0].fields["job"] == "close"  # type: ignore[attr-defined]
    assert skipped[0].fields["key"] == "2026-11-28T00:00:00Z"  # type: ignore[attr-defined]
    history = await app.history("close")
    assert [(c.key, c.scheduled_for) for c in history] == [("2026-11-28T00:00:00Z", FRIDAY)]
    assert history[0].finished_at is not None and history[0].duration is not None


async def test_sync_job_gets_a_session_on_the_same_transaction(app: Oncely) -> None:
    @app.job(every(minutes=5))
    def sweep(db, now):  # type: ignore[no-untyped-def]
        assert isinstance(db, Session)
        db.execute(sa.text("INSERT INTO coins VALUES ('beto', :s)"), {"s": now.isoformat()})
        raise RuntimeError("after writing")

    with pytest.raises(RuntimeError, match="after writing"):
        await app.run("sweep", datetime(2026, 11, 29, 10, 7, tzinfo=timezone.utc))
    assert await coins(app) == []
    assert await app.history() == []


@pytest.mark.parametrize("action", ["commit", "rollback", "close"])
async def test_a_job_cannot_end_the_transaction(app: Oncely, action: str) -> None:
    @app.job(every(minutes=5))
    async def rogue(db, now):  # type: ignore[no-untyped-def]
        await db.execute(sa.text("INSERT INTO coins VALUES ('carla', 'x')"))
        await getattr(db, action)()

    with pytest.raises(JobTransactionError, match=f"called {action}"):
        await app.run("rogue", datetime(2026, 11, 29, 10, 7, tzinfo=timezone.utc))
    assert await coins(app) == [] and await app.history() == []


async def test_a_job_that_swallows_the_refusal_still_fails(app: Oncely) -> None:
    @app.job(every(minutes=5))
    async def sneaky(db, now):  # type: ignore[no-untyped-def]
        await db.execute(sa.text("INSERT INTO coins VALUES ('dora', 'x')"))
        with contextlib.suppress(JobTransactionError):
            await db.commit()

    result = await app.attempt("sneaky", datetime(2026, 11, 29, 10, 7, tzinfo=timezone.utc))
    assert result.status is RunStatus.FAILED
    assert isinstance(result.error, JobTransactionError)
    assert await coins(app) == []


async def test_losers_dont_wait_busy_returns_while_the_winner_runs(app: Oncely) -> None:
    inside, release = asyncio.Event(), asyncio.Event()

    @app.job(every(minutes=5))
    async def slow(db, now):  # type: ignore[no-untyped-def]
        await db.execute(sa.text("INSERT INTO coins VALUES ('eva', 'x')"))
        inside.set()
        await release.wait()

    now = datetime(2026, 11, 29, 10, 7, tzinfo=timezone.utc)
    winner = asyncio.create_task(app.run("slow", now))
    await asyncio.wait_for(inside.wait(), 10)
    started = time.monotonic()
    loser = await app.run("slow", now)
    waited = time.monotonic() - started
    release.set()
    assert (await winner).status is RunStatus.RAN
    assert loser.status is RunStatus.BUSY
    assert waited < 1.0, waited  # it never queued behind the winner, which waited for us
    assert await coins(app) == [("eva", "x")]


async def test_run_before_migrate_names_the_fix(db_url: str) -> None:
    app = Oncely(db_url)

    @app.job(every(minutes=5))
    async def early(db, now):  # type: ignore[no-untyped-def]
        raise AssertionError("must not be called")

    with pytest.raises(SchemaMissingError, match="run `oncely migrate`"):
        await app.run("early")
    await app.aclose()


@pytest.mark.parametrize("kind", ["engine", "sessionmaker"])
async def test_app_accepts_a_users_engine_or_sessionmaker(db_url: str, kind: str) -> None:
    engine = create_async_engine(normalize_url(db_url))
    app = Oncely(engine if kind == "engine" else async_sessionmaker(engine))
    await app.migrate()

    @app.job(every(hours=1))
    async def hourly(db, now):  # type: ignore[no-untyped-def]
        await db.execute(sa.text("SELECT 1"))

    now = datetime(2026, 11, 29, 10, 7, tzinfo=timezone.utc)
    assert (await app.run("hourly", now)).status is RunStatus.RAN
    assert (await app.run("hourly", now)).status is RunStatus.SKIPPED
    await app.aclose()  # the user's engine stays usable
    async with engine.connect() as conn:
        assert (await conn.execute(sa.text("SELECT count(*) FROM oncely_runs"))).scalar() == 1
    await engine.dispose()


async def test_release_lets_a_slot_run_again(app: Oncely) -> None:
    calls = []

    @app.job(every(minutes=5))
    async def again(db, now):  # type: ignore[no-untyped-def]
        calls.append(now)

    now = datetime(2026, 11, 29, 10, 7, tzinfo=timezone.utc)
    result = await app.run("again", now)
    assert (await app.release("again", result.key)) is not None
    assert (await app.release("again", result.key)) is None
    assert (await app.run("again", now)).status is RunStatus.RAN
    assert len(calls) == 2
