"""bench/in_flight.py keeps working and counts right: its --quick form on Postgres, oncely only
(never a timing assertion; the peers are the bench's own requirements, not the test suite's)."""

from __future__ import annotations

import os

import pytest
from tests.conftest import PG_ADMIN_URL
from tests.support import drop_databases, run_bench

QUICK_TASKS = 200
QUICK_POOL = 4


@pytest.mark.postgres
@pytest.mark.timeout(400)
def test_in_flight_bench_counts(postgres_database: str) -> None:
    prefix = f"oncely_bench_inflight_{os.getpid()}"
    try:
        done = run_bench(
            "in_flight.py",
            "--quick", "--systems", "oncely", "--idle", "1", "--database-url", PG_ADMIN_URL,
            "--database-prefix", prefix,
        )  # fmt: skip
    finally:
        left = drop_databases(PG_ADMIN_URL, prefix)
    assert done.returncode == 0, done.stderr[-3000:]
    assert left == [], left  # the bench drops the databases it created
    rows = {
        cells[0]: cells
        for line in done.stdout.splitlines()
        if line.startswith("| ")
        and (cells := [c.strip() for c in line.strip().strip("|").split("|")])[0] != "system"
    }
    # Each task ran once; each one-row task's insert landed (with its ack).
    one_row = rows["oncely"]
    assert one_row[4] == f"{QUICK_TASKS} (0)", one_row
    assert one_row[5] == str(QUICK_TASKS), one_row
    # Connections seen in pg_stat_activity during the drain: some, and never more than the
    # pool, the control connection and the LISTEN, at concurrency 50.
    assert 1 <= int(one_row[3]) <= QUICK_POOL + 2, one_row
    # The sleep alone takes no connection of the pool: only the control and LISTEN ones.
    no_db = rows["oncely, no database"]
    assert no_db[4] == f"{QUICK_TASKS} (0)", no_db
    assert no_db[5] == "0", no_db
    assert 1 <= int(no_db[3]) <= 2, no_db
    assert float(one_row[1].replace(",", "")) > 0, one_row
    # The machine's CPU per task counts this process's and the server's: at least the first.
    assert float(one_row[7]) >= float(one_row[6]) > 0, one_row
    # The floor: pgbench sent the same transaction, once per task, on the pool's connections.
    floor = rows["floor: pgbench, the same transaction"]
    assert float(floor[1].replace(",", "")) > 0, floor
    assert floor[3] == str(QUICK_POOL) and floor[9].startswith(f"{QUICK_TASKS} transactions"), floor
    # Idle, before and after a burst: the worker keeps within its pool and its own two.
    idle = [line for line in done.stdout.splitlines() if " connections held" in line]
    assert len(idle) == 2, done.stdout
    for line in idle:
        held = int(line.rsplit(" connections held", 1)[0].rsplit(" ", 1)[1])
        assert 1 <= held <= QUICK_POOL + 2, line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--systems", "oncely,celery"], "--systems"),
        (["--pool-size", "0"], "--pool-size"),
        (["--wait", "-1"], "--wait"),
        (["--idle", "-1"], "--idle"),
    ],
)
def test_in_flight_bench_rejects_bad_flags(args: list[str], message: str) -> None:
    done = run_bench("in_flight.py", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
