"""bench/enqueue_cpu.py keeps working: a tiny run on Postgres (never a timing assertion; it
needs pgqueuer, a bench requirement, not a test one)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests.conftest import PG_ADMIN_URL
from tests.support import ROOT


@pytest.mark.postgres
def test_enqueue_cpu_bench_runs(postgres_database: str) -> None:
    pytest.importorskip("pgqueuer")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "enqueue_cpu.py"), "--n", "20", "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ONCELY_BENCH_POSTGRES_URL": PG_ADMIN_URL},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 7, done.stdout
    for row in rows:
        cpu = float(row.split("|")[2].strip().replace(",", ""))
        assert cpu > 0, row
