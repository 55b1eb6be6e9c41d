"""bench/otel_overhead.py keeps working: a tiny run on Postgres, OpenTelemetry absent,
installed and configured (never a timing assertion)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import sqlalchemy as sa
from tests.conftest import PG_ADMIN_URL, _sync_url
from tests.support import ROOT


@pytest.mark.postgres
def test_otel_overhead_bench_runs(postgres_database: str) -> None:
    prefix = f"oncely_otel_{os.getpid()}"
    command = [sys.executable, str(ROOT / "bench" / "otel_overhead.py"), "--calls", "20"]
    command += ["--rounds", "1", "--tasks", "30", "--no-enqueue", "--concurrency", "2"]
    command += ["--database-url", PG_ADMIN_URL, "--database-prefix", prefix]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    finally:
        admin = sa.create_engine(_sync_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{prefix}_oncely" WITH (FORCE)')
        admin.dispose()
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for name in ("enqueue", "attempt", "slot attempt"):
        (row,) = [line for line in lines if line.startswith(f"{name} ")]
        assert len(row.split()) == len(name.split()) + 3, row  # absent, api, sdk
    (drain,) = [line for line in lines if line.startswith("drain one_row c=2 /s")]
    assert all(float(rate) > 0 for rate in drain.split()[-5:-2]), drain
