"""bench/schedules_scale.py keeps working: a small run on the test server (never a timing
assertion: each slot claimed once with one task, the due query an index range), and its bad
flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.conftest import PG_ADMIN_URL
from tests.support import ROOT

BENCH = str(ROOT / "bench" / "schedules_scale.py")


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_schedules_scale_small_run(postgres_database: str) -> None:
    small = ["--schedules", "40", "--workers", "2", "--minutes", "2", "--settle", "1"]
    small += ["--every", "5"]  # all 40 every 5 s: two bursts of 40 slots measured
    done = subprocess.run(
        [sys.executable, BENCH, *small, "--json", "--database-url", PG_ADMIN_URL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env=os.environ,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["exit_codes"] == [0, 0]  # both workers stopped cleanly on SIGTERM
    assert report["slots_due"] == report["slots_claimed"] == 80
    assert report["claimed_once"] and report["slots_with_one_task"] == 80
    assert report["duplicate_tasks"] == 0
    assert report["latency_s"]["p99"] is not None
    assert any("oncely_schedules_due" in line for line in report["due_query_plan"])
    assert not any("Seq Scan" in line for line in report["due_query_plan"])


@pytest.mark.parametrize(
    "flags", [["--workers", "0"], ["--schedules", "0"], ["--settle", "-1"], ["--every", "0"]]
)
def test_schedules_scale_rejects_bad_flags(flags: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, BENCH, *flags], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert flags[0] in done.stderr
