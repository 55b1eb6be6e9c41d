"""bench/enqueue_notify.py keeps working: a tiny run on Postgres (never a timing assertion)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests.conftest import PG_ADMIN_URL
from tests.support import ROOT


@pytest.mark.postgres
def test_enqueue_notify_bench_runs(postgres_database: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "enqueue_notify.py"),
            *("--enqueuers", "2", "--batch", "5", "--seconds", "0.05", "--rounds", "2"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ONCELY_BENCH_POSTGRES_URL": PG_ADMIN_URL},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("| ")]
    rounds = [r for r in rows if r[1].strip().isdigit()]
    assert [(r[1].strip(), r[2].strip()) for r in rounds] == [
        ("1", "single"),
        ("1", "batch"),
        ("2", "single"),
        ("2", "batch"),
    ]
    for row in rounds:
        assert float(row[3].replace(",", "")) > 0 and float(row[4].replace(",", "")) > 0, row
