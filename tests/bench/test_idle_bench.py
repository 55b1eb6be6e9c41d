"""bench/idle.py keeps working: a small run on a Postgres cluster of its own (never a timing
assertion), and its bad flags."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from tests.support import IN_CI, ROOT

pytestmark = pytest.mark.skipif(
    shutil.which("pg_createcluster") is None and not IN_CI,
    reason="pg_createcluster is not installed (postgresql-common)",
)


SMALL = ["--workers", "2", "--window", "3", "--probes", "10", "--spacing", "0.05", "--settle", "1"]


@pytest.mark.timeout(600)  # a cluster's start, two workers' start and a few seconds idle
def test_idle_bench_small_run() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "idle.py"), *SMALL, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,
        env=os.environ,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["exit_codes"] == [0, 0]  # both workers stopped cleanly on SIGTERM
    idle, wake = report["idle"], report["wake_up"]
    assert idle["backends"] > 0 and idle["statements_per_s_per_worker"] is not None
    # pg_stat_statements saw the probes' own statements (idle, the workers may send none)
    assert any("INSERT INTO idle_probes" in s["query"] for s in wake["by_statement"])
    assert wake["started"] == wake["probes"] == 10  # every probe task ran, once
    assert wake["p99_ms"] is not None
    # The floor: every probe reached the one plain listener it named.
    assert report["floor"]["received"] == report["floor"]["probes"] == 10
    assert report["floor"]["listeners"] == 2
    # Its cluster is gone.
    cluster = re.search(r"cluster: (\S+)/(\S+) on port", done.stderr)
    assert cluster is not None, done.stderr
    listed = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout
    assert cluster.group(2) not in listed


def test_idle_bench_rejects_bad_flags() -> None:
    for flags, name in ((["--workers", "0"], "--workers"), (["--window", "-1"], "--window")):
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "idle.py"), *flags],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        assert name in done.stderr
