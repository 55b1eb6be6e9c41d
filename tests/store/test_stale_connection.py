"""A pooled Postgres connection killed by the server is replaced, not reported as an outage."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import sqlalchemy as sa
from tests.conftest import _reset_postgres, _sync_url

from oncely import Oncely, RunStatus, every
from oncely.store import postgres

SLOT = datetime(2026, 11, 27, 18, 0, tzinfo=timezone.utc)


def _kill_other_backends(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        killed = conn.execute(
            sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    return int(killed)


@pytest.mark.postgres
async def test_idle_connection_killed_by_the_server_is_replaced(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _reset_postgres(postgres_database)
    sync_engine = sa.create_engine(_sync_url(postgres_database))
    app = Oncely(postgres_database)

    @app.job(every(minutes=1), name="tick")
    async def tick(db, now) -> None:  # type: ignore[no-untyped-def]
        return None

    try:
        await app.migrate()
        assert (await app.run("tick", now=SLOT)).status is RunStatus.RAN
        assert _kill_other_backends(sync_engine) >= 1  # the app's pooled connection
        monkeypatch.setattr(postgres, "PING_AFTER_IDLE_S", 0.0)  # it counts as idle now
        result = await app.run("tick", now=SLOT.replace(minute=1))
        assert result.status is RunStatus.RAN
        with sync_engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM oncely_runs")).scalar_one() == 2
    finally:
        await app.aclose()
        sync_engine.dispose()
