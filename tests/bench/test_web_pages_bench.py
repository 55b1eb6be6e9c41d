"""bench/web_pages.py keeps working: a small fill on Postgres, every page timed and answered
200 (never a timing assertion), its database dropped."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import sqlalchemy as sa
from tests.conftest import PG_ADMIN_URL, _sync_url
from tests.support import ROOT

PAGES = [
    "/",
    "/jobs/job_7",
    "/jobs/job_7?n=500",
    "/tasks",
    "/tasks?state=available",
    "/tasks?state=running",
    "/tasks?state=dead",
    "/tasks?state=discarded",
    "/tasks?state=succeeded",
    "/tasks?queue=mail",
    "/tasks?task=task_3",
    "/tasks?state=dead&queue=mail&task=task_1",
    "/audit",
    "/audit?job=job_3",
    "/healthz",
]


def _rows(stdout: str) -> dict[str, list[str]]:
    return {
        cells[0].strip("`"): cells[1:]
        for line in stdout.splitlines()
        if line.startswith("| `")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }


@pytest.mark.postgres
@pytest.mark.timeout(400)  # a small fill and 18 pages: about 30 s
def test_web_pages_bench_small_run(postgres_database: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "web_pages.py"),
            *("--tasks", "5000", "--claims", "1000", "--audit", "300", "--requests", "2"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=350,
        env={**os.environ, "ONCELY_BENCH_POSTGRES_URL": PG_ADMIN_URL},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows: oncely_tasks 5,000, oncely_runs 1,000," in done.stdout, done.stdout
    rows = _rows(done.stdout)
    for page in PAGES:
        assert page in rows, (page, sorted(rows))
    for page, cells in rows.items():
        status, median, p95 = cells[0], float(cells[1]), float(cells[2])
        assert status == "200", (page, cells)
        assert 0 < median <= p95, (page, cells)
    assert any(p.startswith("/tasks?cursor=") for p in rows), sorted(rows)
    assert any(p.startswith("/tasks?key=key:") for p in rows), sorted(rows)
    assert any(p.startswith("/tasks/") for p in rows), sorted(rows)
    database = done.stdout.rsplit("database ", 1)[1].split()[0]
    assert done.stdout.rstrip().endswith(f"database {database} dropped")
    admin = sa.create_engine(_sync_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        left = conn.execute(
            sa.text("SELECT datname FROM pg_database WHERE datname = :name"), {"name": database}
        ).all()
    admin.dispose()
    assert left == []


def test_web_pages_bench_rejects_bad_flags() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "web_pages.py"), "--requests", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--requests" in done.stderr
