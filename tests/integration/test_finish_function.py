"""Migration 3: `oncely_finish_claim()` on Postgres, which ends every asyncpg attempt.

A database migrated by an older oncely gets it from `oncely migrate` and keeps its claims;
until then the app refuses to run (an attempt would fail at its commit), naming the fix.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from tests.conftest import _reset_postgres

import oncely.store
from oncely import Oncely, RunStatus, SchemaMissingError, every

pytestmark = pytest.mark.postgres

SLOT = datetime(2030, 1, 1, tzinfo=timezone.utc)


def tick_app(url: str) -> Oncely:
    app = Oncely(url)

    @app.job(every(seconds=1), name="tick")
    async def tick(db, now) -> None:  # type: ignore[no-untyped-def]
        return None

    return app


async def functions(app: Oncely) -> list[str]:
    async with app.store.engine.connect() as conn:
        rows = await conn.execute(
            sa.text("SELECT proname FROM pg_proc WHERE proname LIKE 'oncely%' ORDER BY 1")
        )
        return [r[0] for r in rows]


async def test_a_version_2_database_migrates_and_its_attempts_finish(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _reset_postgres(postgres_database)
    old = tick_app(postgres_database)
    monkeypatch.setattr(oncely.store, "MIGRATIONS", oncely.store.MIGRATIONS[:2])
    try:
        assert await old.store.migrate() == [1, 2]  # what an older oncely created
        async with old.store.engine.begin() as conn:
            await conn.execute(
                sa.text(
                    "INSERT INTO oncely_runs (job, key, claimed_at, claimed_by, finished_at) "
                    "VALUES ('tick', 'before', now(), 'old:1', now())"
                )
            )
    finally:
        await old.aclose()
    monkeypatch.undo()

    app = tick_app(postgres_database)
    try:
        with pytest.raises(SchemaMissingError, match="oncely migrate"):
            await app.run("tick", now=SLOT)
        assert "oncely_finish_claim" not in await functions(app)
        assert await app.migrate() == [3]
        assert "oncely_finish_claim" in await functions(app)
        for second in range(2):
            result = await app.run("tick", now=SLOT + timedelta(seconds=second))
            assert result.status is RunStatus.RAN
        claims = await app.history("tick")
        assert sorted(c.key for c in claims)[-1] == "before"
        assert len(claims) == 3
        assert all(c.finished_at is not None and c.finished_at >= c.claimed_at for c in claims)
    finally:
        await app.aclose()
