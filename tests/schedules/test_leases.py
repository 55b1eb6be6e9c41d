"""Three real worker processes on Postgres read the same due schedules: each due row is
attempted by one worker at a time (read with FOR UPDATE SKIP LOCKED and leased), so every slot
is claimed once and no worker's attempt finds its slot taken by another (no duplicate recorded
in oncely_duplicates, where every such attempt leaves a row)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import _reset_postgres
from tests.schedules.conftest import APP, fresh_app, migrate, rows
from tests.support import ROOT, environ, stop, wait_until

SCHEDULES = 24
"""Schedules due at the same instants: more than one worker attempts at once (8)."""
SLOTS = 4
"""Slots of each schedule the test waits for."""


@pytest.fixture
def workers(postgres_database: str, tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    _reset_postgres(postgres_database)
    migrate(postgres_database)
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        stop(proc)


def _start(db_url: str, log: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "oncely", "--app", f"{APP}:app", "worker"]
    with log.open("w") as out:
        return subprocess.Popen(
            [*argv, "--schedule-poll", "0.2", "--concurrency", "0"],
            cwd=ROOT,
            env=environ({"ONCELY_DATABASE_URL": db_url}),
            text=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.postgres
@pytest.mark.timeout(240)  # three worker processes through a few seconds of slots
def test_three_workers_attempt_each_due_schedule_one_at_a_time(
    postgres_database: str, tmp_path: Path, workers: list[subprocess.Popen[str]]
) -> None:
    db = postgres_database
    app = fresh_app(db)
    for i in range(SCHEDULES):
        app.schedules.add_sync(f"t{i:02}", every="1s", job="report", args={"tenant": f"t{i:02}"})
    workers += [_start(db, tmp_path / f"worker-{i}.log") for i in range(3)]

    def claimed() -> int:
        return int(rows(db, "SELECT count(*) FROM oncely_runs WHERE job LIKE 'schedule:%'")[0][0])

    wait_until(lambda: claimed() >= SCHEDULES * SLOTS, f"{SLOTS} slots of each schedule")
    for proc in workers:
        assert stop(proc)[0] == 0
    ran_by = rows(
        db, "SELECT claimed_by, count(*) FROM oncely_runs WHERE job LIKE 'schedule:%' GROUP BY 1"
    )
    print(f"slots claimed by each worker: {sorted(n for _w, n in ran_by)}")
    claims = rows(db, "SELECT job, key FROM oncely_runs WHERE job LIKE 'schedule:%'")
    effects = rows(db, "SELECT arg FROM effects WHERE what = 'report' AND arg LIKE 't%'")
    assert len(effects) == len(claims)  # every claimed slot ran once, no slot ran twice
    taken = rows(db, "SELECT job, key FROM oncely_duplicates WHERE job LIKE 'schedule:%'")
    assert taken == [], f"{len(taken)} attempts found their slot taken by another worker"
