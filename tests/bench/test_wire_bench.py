"""bench/wire.py keeps working and counts right: its short form on Postgres, the driver's shapes
and oncely's worker (never a timing assertion; pgqueuer is the bench's own requirement, not the
test suite's)."""

from __future__ import annotations

import os

import pytest
from tests.conftest import PG_ADMIN_URL
from tests.support import drop_databases, run_bench

SHAPES = [
    "asyncpg, alone",
    "asyncpg, group 5",
    "psycopg, alone",
    "psycopg pipeline, alone",
    "psycopg pipeline, group 5",
    "asyncpg, pgqueuer's messages",
    "oncely worker, alone",
    "oncely worker, group 5",
]


@pytest.mark.postgres
@pytest.mark.timeout(400)
def test_wire_bench_drains_every_shape_once(postgres_database: str) -> None:
    prefix = f"oncely_bench_wire_{os.getpid()}"
    try:
        done = run_bench(
            "wire.py",
            "--systems", "shapes,oncely", "--tasks", "120", "--lanes", "3", "--group", "5",
            "--batch", "7", "--rounds", "1", "--database-url", PG_ADMIN_URL,
            "--database-prefix", prefix,
        )  # fmt: skip
    finally:
        left = drop_databases(PG_ADMIN_URL, prefix)
    assert done.returncode == 0, done.stderr[-3000:]
    assert left == [], left  # the bench drops the databases it made
    rows = {
        cells[0]: cells
        for line in done.stdout.splitlines()
        if line.startswith("| ")
        and (cells := [c.strip() for c in line.strip().strip("|").split("|")])[0] != "shape"
    }
    assert list(rows) == SHAPES, done.stdout
    for label in SHAPES:  # a shape that lost an effect or an ack exits 1 (the bench counts)
        rate, cpu, machine = (float(rows[label][i].replace(",", "")) for i in (2, 4, 5))
        assert rate > 0 and cpu > 0 and machine > 0, rows[label]
        assert rows[label][3] == "n/a", rows[label]  # no pgqueuer in this run: no ratio
    assert rows["asyncpg, group 5"][1] == "2 + 2/5"
    assert rows["psycopg pipeline, alone"][1] == "1"


def test_wire_bench_refuses_a_bad_option() -> None:
    done = run_bench("wire.py", "--lanes", "ten")
    assert done.returncode == 2
    assert "--lanes: not a list of numbers: 'ten'" in done.stderr
    assert "Traceback" not in done.stderr
