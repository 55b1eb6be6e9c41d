"""bench/task_execution.py keeps working and counts right: its smallest form on Postgres and
SQLite (never a timing assertion)."""

from __future__ import annotations

import os

import pytest
from tests.conftest import PG_ADMIN_URL
from tests.support import run_bench

SMALLEST = [
    "--tasks", "60", "--io-tasks", "60", "--io-lane-tasks", "20", "--io-concurrency", "30",
    "--io-pool-size", "4", "--io-wait", "0.01", "--concurrency", "2", "--rounds", "1",
    "--writers", "50", "--fail-at", "25", "--sqlite-wait", "0.2", "--sqlite-repeats", "1",
    "--no-pgqueuer",
]  # fmt: skip


def _rows(stdout: str) -> dict[tuple[str, str], list[str]]:
    """The main table's cells by (workload, option)."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 12 and cells[0] != "workload":
            rows[cells[0], cells[1]] = cells
    return rows


@pytest.mark.postgres
def test_task_execution_bench_counts(postgres_database: str) -> None:
    prefix = f"oncely_bench_exec_{os.getpid()}"
    done = run_bench(
        "task_execution.py", *SMALLEST, "--database-url", PG_ADMIN_URL, "--database-prefix", prefix
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(done.stdout)
    # Every drain ran each task once and landed each one-row task's insert with its ack.
    for option in ("A", "A/sp", "B", "C", "C+", "C2", "D", "E1", "E2"):
        cells = rows["one-row", option]
        assert cells[9:] == ["60 (0 twice)", "60", "60"], cells
        assert float(cells[5].replace(",", "")) > 0, cells
    for option in ("A", "B", "D"):
        assert rows["I/O", option][9:] == ["20 (0 twice)", "20", "20"], rows["I/O", option]
    for option in ("C", "C+", "C2", "E1", "E2"):
        assert rows["I/O", option][9:] == ["60 (0 twice)", "60", "60"], rows["I/O", option]
        assert 1 <= int(rows["I/O", option][8]) <= 4, rows["I/O", option]  # within the pool
    # A task that never touches the database takes no connection for its run: only the
    # leaser, the acker and the heartbeat ever hold one (one statement each).
    assert rows["I/O", "C no-DB"][9:] == ["60 (0 twice)", "0", "60"], rows["I/O", "C no-DB"]
    assert int(rows["I/O", "C no-DB"][8]) <= 3, rows["I/O", "C no-DB"]
    # Task 25 of 50 fails after its insert: today's shape runs the 24 writers before it
    # twice; every other shape runs each body once. Its insert never lands; the rest do.
    assert rows["failure", "A"][9:] == ["74 (24 twice)", "49", "49"], rows["failure", "A"]
    for option in ("A/sp", "B", "C", "D"):
        assert rows["failure", option][9:] == ["50 (0 twice)", "49", "49"], option
    sqlite = [line for line in done.stdout.splitlines() if "its first write |" in line]
    assert len(sqlite) == 2, done.stdout


def test_task_execution_bench_rejects_bad_flags() -> None:
    done = run_bench("task_execution.py", "--fail-at", "60", "--writers", "50")
    assert done.returncode == 2
    assert "--fail-at" in done.stderr
