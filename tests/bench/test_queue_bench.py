"""bench/queues.py keeps working: a tiny run of oncely's rows on Postgres (never a timing
assertion; the peers are the bench's own requirements, not the test suite's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import sqlalchemy as sa
from tests.conftest import PG_ADMIN_URL, _sync_url
from tests.support import ROOT

ROWS = [
    "enqueue single, own transaction /s",
    "enqueue single, own transaction, asyncpg connection /s",
    "enqueue single, own transaction, SQLAlchemy alone /s",
    "enqueue single, autocommit /s",
    "enqueue single, autocommit, SQLAlchemy alone /s",
    "enqueue batch, asyncpg connection /s",
    "drain noop c=2 /s",
    "drain one_row c=1 /s",
    "drain one_row best /s",
    "drain one_row_driver c=2 /s",
    "drain keyed c=1 /s",
    "drain rated best /s",
    "latency p50 ms",
    "latency p99 ms",
]


@pytest.mark.postgres
@pytest.mark.timeout(900)  # the benchmark's run may take 300 s
def test_queue_bench_runs(postgres_database: str) -> None:
    prefix = f"oncely_bench_{os.getpid()}"
    bench = [sys.executable, str(ROOT / "bench" / "queues.py"), "--systems", "oncely"]
    sizes = ["--tasks", "300", "--single", "20", "--concurrency", "1,2", "--samples", "10"]
    where = ["--database-url", PG_ADMIN_URL, "--database-prefix", prefix, "--rounds", "1"]
    try:
        done = subprocess.run(
            [*bench, *sizes, *where],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        admin = sa.create_engine(_sync_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            left = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_database WHERE datname = %(name)s",
                {"name": f"{prefix}_oncely"},
            ).scalar_one()
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{prefix}_oncely" WITH (FORCE)')
        admin.dispose()
    assert left == 0  # the run drops the database it made
    assert done.returncode == 0, done.stderr[-3000:]
    table = {
        line.split(" | ")[0].removeprefix("| "): line
        for line in done.stdout.splitlines()
        if line.startswith("| ")
    }
    for row in ROWS:
        assert row in table, (row, done.stdout)
        value = table[row].split("|")[2].strip().replace(",", "")
        assert float(value) > 0, table[row]
