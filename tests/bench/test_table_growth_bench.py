"""bench/table_growth.py keeps working: its --quick run on Postgres (never a timing assertion)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import sqlalchemy as sa
from tests.conftest import PG_ADMIN_URL, _sync_url
from tests.support import ROOT

RATES = [
    "claim_run on AsyncSession /s",
    "app.run no-op /s",
    "enqueue on AsyncSession /s",
    "one-row drain c=2 /s",
]
LISTINGS = [
    "`oncely history job_7 --limit 50`",
    "`oncely tasks --state dead --limit 50`",
    "`oncely tasks --state succeeded --limit 50`",
    "`oncely list`'s last runs (`app.last_runs`)",
    "a starting worker's newest slots (`store.claims.last_slots`)",
]
PRUNE = ["prune time, s", "finished tasks deleted", "claims deleted", "tasks drained meanwhile"]


def _rows(stdout: str) -> dict[str, list[str]]:
    return {
        cells[0]: cells[1:]
        for line in stdout.splitlines()
        if line.startswith("| ")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }


@pytest.mark.postgres
@pytest.mark.timeout(600)  # the smoke run fills and drains two databases: about 30 s
def test_table_growth_bench_quick_run(postgres_database: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "table_growth.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,
        env={**os.environ, "ONCELY_BENCH_POSTGRES_URL": PG_ADMIN_URL},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(done.stdout)
    for name in RATES:
        empty, full = (float(v.replace(",", "")) for v in rows[name][:2])
        assert empty > 0 and full > 0, rows[name]
    for name in LISTINGS:
        assert len(rows[name]) == 2, rows
    for name in PRUNE:
        assert name in rows, rows
    # The quick fill's old rows (2/3 of the finished tasks, most claims) are pruned, on the
    # full side only, while the worker kept draining.
    assert rows["finished tasks deleted"] == ["0", "6,666"]
    assert rows["claims deleted"][0] == "0" and int(rows["claims deleted"][1].replace(",", "")) > 0
    assert int(rows["tasks drained meanwhile"][1].replace(",", "")) >= 0
    # Its databases are gone.
    databases = done.stdout.split("databases: ", 1)[1].split("\n", 1)[0].split(", ")
    assert len(databases) == 2, databases
    admin = sa.create_engine(_sync_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        left = conn.execute(
            sa.text("SELECT datname FROM pg_database WHERE datname = ANY(:names)"),
            {"names": databases},
        ).all()
    admin.dispose()
    assert left == []


def test_table_growth_bench_rejects_bad_flags() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "table_growth.py"), "--rounds", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--rounds" in done.stderr


SMALL_FILL = ["--claims", "2000", "--finished", "2000", "--queued", "200", "--reads", "2"]


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_listing_plans_small_run(postgres_database: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "listing_plans.py"), *SMALL_FILL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=250,
        env={**os.environ, "ONCELY_BENCH_POSTGRES_URL": PG_ADMIN_URL},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(done.stdout)
    for name in ("`oncely list`'s last runs", "a starting worker's newest slots"):
        assert len(rows[name]) == 1 and " / " in rows[name][0], rows
