"""The claim and finish statements, built once per database, write what the ledger promises."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

import oncely
import oncely.schema
from oncely import Oncely, RunStatus, every
from oncely.store import normalize_url

SLOT = datetime(2026, 11, 27, 18, 0, tzinfo=timezone.utc)


async def test_run_stamps_claim_and_finish_for_each_slot(db_url: str) -> None:
    app = Oncely(db_url)

    @app.job(every(minutes=1), name="tick")
    async def tick(db, now) -> None:  # type: ignore[no-untyped-def]
        return None

    try:
        await app.migrate()
        for minute in (0, 1):
            result = await app.run("tick", now=SLOT.replace(minute=minute))
            assert result.status is RunStatus.RAN
        claims = sorted(await app.history("tick"), key=lambda c: c.key)
    finally:
        await app.aclose()
    assert [c.key for c in claims] == ["2026-11-27T18:00:00Z", "2026-11-27T18:01:00Z"]
    assert [c.scheduled_for for c in claims] == [SLOT, SLOT.replace(minute=1)]
    for claim in claims:
        assert claim.finished_at is not None and claim.finished_at >= claim.claimed_at


async def test_bare_claims_on_two_databases_in_one_process(
    db_url: str, sync_engine: sa.Engine, tmp_path: Path
) -> None:
    """Each database gets its own claim statement, even when one process uses both."""
    app = Oncely(db_url)
    await app.migrate()
    await app.aclose()
    engine = create_async_engine(normalize_url(db_url))
    other = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'other.db'}")
    try:
        async with other.begin() as conn:
            await conn.run_sync(oncely.schema.metadata.create_all)
        won = []
        for eng in (engine, other, engine):
            async with async_sessionmaker(eng)() as session, session.begin():
                won.append(await oncely.claim_run(session, "bare", "k1"))
    finally:
        await engine.dispose()
        await other.dispose()
    assert won == [True, True, False]
    with sync_engine.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM oncely_runs WHERE job = 'bare'")).one()
    assert row.key == "k1" and row.scheduled_for is None and row.finished_at is None
    assert row.claimed_at is not None and row.claimed_by.endswith(f":{os.getpid()}")
