"""SQLite: a connection handed back to the pool with a transaction open is rolled back.

oncely's SQLite engines skip SQLAlchemy's blanket rollback-on-return (a thread hop after
every commit) and roll back only transactions still open; a forgotten one must not keep
the database's write lock.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from oncely import Oncely, RunStatus, every

SLOT = datetime(2026, 11, 27, 18, 0, tzinfo=timezone.utc)


async def test_open_transaction_is_rolled_back_on_return(tmp_path: Path) -> None:
    app = Oncely(f"sqlite:///{tmp_path / 'oncely.db'}")

    @app.job(every(minutes=1), name="tick")
    async def tick(db, now) -> None:  # type: ignore[no-untyped-def]
        return None

    try:
        await app.migrate()
        engine = app.store.engine
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            await driver.execute("BEGIN IMMEDIATE")  # behind SQLAlchemy's back
            await driver.execute(
                "INSERT INTO oncely_runs (job, key, claimed_at, claimed_by) "
                "VALUES ('ghost', 'k', '2026-01-01 00:00:00', 'test:1')"
            )
            assert driver.in_transaction
        assert engine.sync_engine.pool.checkedin() == 1
        result = await app.run("tick", now=SLOT)
        assert result.status is RunStatus.RAN
        assert [c.job for c in await app.history()] == ["tick"]  # the ghost row is gone
    finally:
        await app.aclose()
