"""`overlap="skip"` holds across processes: one slot of a job at a time, anywhere."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.apps.leaderboard import create_tables
from tests.support import ROOT, run_cli

from oncely import Oncely, RunStatus, every

NOW = datetime(2026, 11, 29, 10, 7, tzinfo=timezone.utc)


@pytest.mark.parametrize("overlap", ["skip", "allow"])
async def test_a_second_slot_of_a_running_job(db_url: str, overlap: str) -> None:
    app = Oncely(db_url)
    await app.migrate()
    inside, release = asyncio.Event(), asyncio.Event()
    calls: list[datetime] = []

    @app.job(every(minutes=5), overlap=overlap)
    async def report(db, now):  # type: ignore[no-untyped-def]
        calls.append(now)
        if len(calls) == 1:
            inside.set()
            await release.wait()

    first = asyncio.create_task(app.run("report", NOW))
    await asyncio.wait_for(inside.wait(), 10)
    second = await app.run("report", NOW + timedelta(minutes=5))  # the next slot
    release.set()
    assert (await first).status is RunStatus.RAN
    if db_url.startswith("sqlite"):
        # One writer: the second attempt cannot start while the first holds the database.
        assert second.status is RunStatus.BUSY
    elif overlap == "skip":
        assert second.status is RunStatus.OVERLAP
        assert len(calls) == 1
        # Nothing was claimed for the skipped slot: it is not "done", only not started.
        assert [c.key for c in await app.history("report")] == [first.result().key]
    else:
        assert second.status is RunStatus.RAN and len(calls) == 2
    await app.aclose()


@pytest.mark.postgres
def test_oncely_run_reports_overlap_from_another_process(
    postgres_database: str, tmp_path: Path
) -> None:
    from tests.conftest import _reset_postgres

    _reset_postgres(postgres_database)
    env = {
        "ONCELY_DATABASE_URL": postgres_database,
        "ONCELY_APP": "tests.apps.leaderboard:app",
        "ONCELY_TEST_SIGNALS": str(tmp_path),
    }
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    engine = sa.create_engine(postgres_database.replace("postgresql://", "postgresql+psycopg2://"))
    create_tables(engine)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "oncely",
            "run",
            "close_then_hang",
            "--now",
            "2026-11-20T18:00:00-06:00",
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob("started-*")):
        assert time.monotonic() < deadline, "the holder never started"
        time.sleep(0.02)
    next_week = run_cli(
        "run", "close_then_hang", "--now", "2026-11-27T18:00:00-06:00", cwd=ROOT, env=env
    )
    (tmp_path / "release").touch()
    assert holder.wait(timeout=30) == 0
    assert next_week.returncode == 0
    assert next_week.stdout.startswith("overlap close_then_hang slot 2026-11-27T18:00:00-06:00")
    assert "run.overlap_skipped" in next_week.stderr
    with engine.connect() as conn:
        keys = [r[0] for r in conn.execute(sa.text("SELECT key FROM oncely_runs"))]
    engine.dispose()
    assert keys == ["2026-11-21T00:00:00Z"]
