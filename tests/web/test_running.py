"""A slot running in another process shows as `running` on its job's timeline, and the
page's cancel stops it there (Postgres: on SQLite the running attempt holds the write lock
that a cancel request needs)."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from tests.conftest import _reset_postgres
from tests.support import ROOT, engine_for, run_cli, start_cli
from tests.web.conftest import Board, attrs

from oncely import Oncely
from oncely.web import Grant, dashboard

TABLES = (
    "CREATE TABLE IF NOT EXISTS effects (job varchar(64) NOT NULL, slot varchar(64) NOT NULL, "
    "replica varchar(255) NOT NULL)"
)


@pytest.fixture
async def operate(postgres_database: str) -> AsyncIterator[Oncely]:
    """The control-plane tests' app (its `hold` job waits for a file), migrated, in this
    process."""
    _reset_postgres(postgres_database)
    env = {"ONCELY_APP": "tests.apps.operate_app:app", "ONCELY_DATABASE_URL": postgres_database}
    done = run_cli("migrate", cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    engine = engine_for(postgres_database)
    with engine.begin() as conn:
        conn.exec_driver_sql(TABLES)
    engine.dispose()
    sys.modules.pop("tests.apps.operate_app", None)
    app: Oncely = importlib.import_module("tests.apps.operate_app").app
    app.use_database(postgres_database)
    yield app
    await app.aclose()
    sys.modules.pop("tests.apps.operate_app", None)


async def _marks(board: Board, slot: str) -> dict[str, str]:
    html = (await board.get("/jobs/hold", n="6")).text
    return dict(
        zip(
            attrs(html, "slot-mark", "data-slot"),
            attrs(html, "slot-mark", "data-outcome"),
            strict=True,
        )
    )


@pytest.mark.postgres
async def test_a_running_slot_shows_and_is_cancelled_from_the_page(
    operate: Oncely, postgres_database: str, tmp_path: Path
) -> None:
    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    slot = now - timedelta(hours=2)
    release = tmp_path / "release"
    holder = start_cli(
        "run",
        "hold",
        "--now",
        slot.isoformat(),
        env={
            **os.environ,
            "ONCELY_APP": "tests.apps.operate_app:app",
            "ONCELY_DATABASE_URL": postgres_database,
            "ONCELY_TEST_HOLD": str(release),
        },
    )
    asgi = dashboard(operate, permissions=lambda _r: Grant("all", actor="ana@ops"))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://dash")
    board = Board(client)
    try:
        deadline = time.monotonic() + 60
        while (await _marks(board, slot.isoformat())).get(slot.isoformat()) != "running":
            assert holder.poll() is None, holder.communicate()
            assert time.monotonic() < deadline, "the slot never showed as running"
            await asyncio.sleep(0.1)  # polling the page, with a deadline
        html = (await board.get("/jobs/hold", n="6")).text
        assert len(attrs(html, "cancel")) == 1
        r = await board.post("/jobs/hold/cancel", slot=slot.isoformat())
        assert r.status_code == 303, r.text
        code = holder.wait(timeout=30)
        assert (await _marks(board, slot.isoformat()))[slot.isoformat()] == "cancelled"
    finally:
        release.touch()
        _out, err = holder.communicate(timeout=30)
        await client.aclose()
    assert code == 1, err  # the attempt was cancelled: rolled back
    ((action, actor),) = [(e.action, e.actor) for e in await operate.audit()]
    assert (action, actor) == ("cancel", "ana@ops")
