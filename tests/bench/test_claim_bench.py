"""bench/claim.py keeps working: a tiny run on each database (never a timing assertion)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tests.support import ROOT

CASES = {
    "sqlite": [
        "raw sqlite3",
        "raw aiosqlite",
        "oncely.claim_run",
        "oncely app.run",
        "oncely app.effect",
        "oncely app.once",
    ],
    "postgres": [
        "raw asyncpg",
        "oncely.claim_run on an asyncpg connection",
        "oncely.claim_run on AsyncSession",
        "app.run's SQL",
        "oncely app.run",
        "oncely.claim_run on the app's engine",
        "oncely app.effect",
        "oncely app.once",
    ],
}
ROWS = {"sqlite": 10, "postgres": 11}


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "claim.py"), "--n", "5", "--rounds", "1", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_claim_bench_runs(db: str, request: pytest.FixtureRequest) -> None:
    args = ["--db", db]
    if db == "postgres":
        server: str = request.getfixturevalue("postgres_database")  # skips if unreachable
        args += ["--postgres-url", server]
    done = _bench(*args)
    assert done.returncode == 0, done.stderr
    table = done.stdout.split(f"{db}: median of 1 rounds", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == ROWS[db]
    for name in CASES[db]:
        assert any(name in row for row in rows), (name, table)
    assert all(row.rstrip().endswith("|") for row in rows)
    # app.effect and app.once are each compared with claim_run on the same engine.
    assert table.count(" vs oncely.claim_run on the app's engine: x") == 2, table


def test_claim_bench_rejects_bad_flags() -> None:
    done = _bench("--db", "sqlite", "--seconds", "0")
    assert done.returncode == 2
    assert "--seconds" in done.stderr
