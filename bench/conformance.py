"""Conformance checker for the worker (after the Jepsen analysis of Chronos).

Runs N `oncely worker` processes on one database for an `every(seconds=1)` job that inserts
one row per call (tests/apps/ticker.py), SIGKILLs a random worker every few seconds and
starts a new one, optionally restarts Postgres once mid-run, then stops every worker with
SIGTERM and matches each expected slot of the run window to the rows:

  missed  expected slots with no row          (must be 0: a worker was alive throughout)
  extra   duplicate rows + rows off the grid   (must be 0: once per slot)

    python bench/conformance.py --database-url postgresql://postgres@127.0.0.1/oncely_soak \
        --duration 600 --workers 4 --restart-postgres 15/main

Prints one JSON report on stdout; exits 1 if missed or extra is not 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
APP = "tests.apps.ticker:app"
DDL = (
    "CREATE TABLE IF NOT EXISTS ticks (job varchar(64) NOT NULL, slot varchar(64) NOT NULL, "
    "replica varchar(255) NOT NULL, ran_at varchar(64) NOT NULL)"
)


def sync_engine(url: str) -> sa.Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        return sa.create_engine(parsed.set(drivername="postgresql+psycopg2"))
    return sa.create_engine(parsed.set(drivername="sqlite"))


def env_for(url: str, extra_jobs: int = 0) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "ONCELY_DATABASE_URL": url,
        "ONCELY_APP": APP,
        "PYTHONPATH": path,
        "ONCELY_TICK_EXTRA": str(extra_jobs),
    }


def prepare(url: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "oncely", "migrate"],
        env=env_for(url),
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    engine = sync_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(DDL)
    engine.dispose()


class Fleet:
    """The worker processes, with their logs in one directory."""

    def __init__(self, url: str, logs: Path, extra_jobs: int = 0) -> None:
        self.url = url
        self.extra_jobs = extra_jobs
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.skewed: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def start(self, skew: str | None = None) -> subprocess.Popen[bytes]:
        """Start one worker; with `skew` (e.g. "+90s"), its clock is off by that much."""
        self.started += 1
        log = (self.logs / f"worker-{self.started:03d}.log").open("wb")
        cmd = [sys.executable, "-m", "oncely", "worker"]
        env = env_for(self.url, self.extra_jobs)
        if skew:
            # libfaketime preloaded into the worker itself (the `faketime` wrapper would be
            # the process we signal); the time is faked relative to the real one.
            env.update(LD_PRELOAD=FAKETIME_LIB, FAKETIME=skew, FAKETIME_DONT_RESET="1")
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=log)
        self.procs.append(proc)
        if skew:
            self.skewed.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def stop(self, timeout: float = 30) -> list[int | None]:
        for proc in self.alive():
            proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(None)
        return codes


def restart_postgres(cluster: str) -> float:
    """Restart the Debian cluster VERSION/NAME (the one the database URL points at)."""
    version, name = cluster.split("/", 1)
    began = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "restart"],
        check=True,
        capture_output=True,
    )
    return time.monotonic() - began


def read_rows(url: str) -> tuple[list[tuple[str, str, str, str]], int]:
    """Every row the jobs wrote, and the number of claims in the ledger for them."""
    engine = sync_engine(url)
    deadline = time.monotonic() + 60
    while True:
        try:
            with engine.connect() as conn:
                rows = [
                    (r.job, r.slot, r.replica, r.ran_at)
                    for r in conn.execute(sa.text("SELECT job, slot, replica, ran_at FROM ticks"))
                ]
                claims = conn.execute(
                    sa.text("SELECT count(*) FROM oncely_runs WHERE job LIKE 'tick%'")
                ).scalar_one()
            engine.dispose()
            return rows, int(claims)
        except sa.exc.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def wait_first_rows(url: str, jobs: int, deadline: float) -> datetime:
    """Wait until every job has run once; the newest of their first slots."""
    engine = sync_engine(url)
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                firsts = conn.execute(
                    sa.text("SELECT job, min(slot) FROM ticks GROUP BY job")
                ).all()
            if len(firsts) == jobs:
                return max(datetime.fromisoformat(f) for _, f in firsts)
            time.sleep(0.05)
    finally:
        engine.dispose()
    raise SystemExit("the workers did not run every job within the deadline")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def check(
    url: str,
    *,
    duration: float,
    workers: int,
    kill_min: float = 2.0,
    kill_max: float = 5.0,
    restart_pg: str | None = None,
    skewed: list[str] | None = None,
    extra_jobs: int = 0,
    seed: int | None = None,
    logs: Path | None = None,
) -> dict[str, object]:
    """Run the scenario and return the report (see the module docstring)."""
    rng = random.Random(seed)
    logs = logs or Path(tempfile.mkdtemp(prefix="oncely-conformance-"))
    prepare(url)
    fleet = Fleet(url, logs, extra_jobs)
    codes: list[int | None] = []
    try:
        for _ in range(workers):
            fleet.start()
        first = wait_first_rows(url, 1 + extra_jobs, time.monotonic() + 60)
        # Skewed workers join once the ledger has claims (see docs/worker.md, clock skew).
        for offset in skewed or []:
            fleet.start(skew=offset)
        began = time.monotonic()
        kills = 0
        pg_restart_s = None
        restart_at = began + duration / 2 if restart_pg else None
        next_kill = began + rng.uniform(kill_min, kill_max)
        while time.monotonic() - began < duration:
            now = time.monotonic()
            if restart_at is not None and now >= restart_at:
                pg_restart_s = round(restart_postgres(restart_pg), 2)
                restart_at = None
            if now >= next_kill and kill_max > 0:
                normal = [p for p in fleet.alive() if p not in fleet.skewed]
                victim = rng.choice(normal)
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                kills += 1
                fleet.start()
                next_kill = now + rng.uniform(kill_min, kill_max)
            time.sleep(0.05)
        stop_at = datetime.now(timezone.utc)
        # Let the slots due before the stop finish (a catch-up after a restart included).
        time.sleep(2.0)
        codes = fleet.stop()
    finally:
        if not codes:  # the run broke off: leave no worker behind
            for proc in fleet.alive():
                proc.kill()

    rows, claims = read_rows(url)
    window_end = stop_at.replace(microsecond=0) - timedelta(seconds=1)
    expected = []
    slot = first
    while slot <= window_end:
        expected.append(slot)
        slot += timedelta(seconds=1)
    counts = Counter((job, datetime.fromisoformat(s)) for job, s, _, _ in rows)
    jobs = ["tick"] + [f"tick_{n}" for n in range(1, extra_jobs + 1)]
    duplicates = sum(c - 1 for c in counts.values())
    off_grid = sum(1 for _, s in counts if s.microsecond)
    missed = sorted((job, s) for job in jobs for s in expected if (job, s) not in counts)
    early = sum(1 for _, s in counts if s > stop_at + timedelta(seconds=3))
    latencies = [
        (datetime.fromisoformat(ran) - datetime.fromisoformat(s)).total_seconds() * 1000
        for _, s, _, ran in rows
    ]
    return {
        "database": make_url(url).get_backend_name(),
        "duration_s": duration,
        "workers": workers,
        "jobs": len(jobs),
        "skewed": skewed or [],
        "expected": len(expected) * len(jobs),
        "rows": len(rows),
        "claims": claims,
        "missed": len(missed),
        "missed_slots": [f"{job}@{s.isoformat()}" for job, s in missed[:20]],
        "extra": duplicates + off_grid,
        "duplicates": duplicates,
        "off_grid": off_grid,
        "early": early,
        "kills": kills,
        "postgres_restart_s": pg_restart_s,
        "processes_started": fleet.started,
        "exit_codes_on_sigterm": sorted({c for c in codes if c is not None and c >= 0}),
        "latency_ms_p50": round(percentile(latencies, 0.5), 1),
        "latency_ms_p99": round(percentile(latencies, 0.99), 1),
        "latency_ms_max": round(max(latencies, default=0.0), 1),
        "logs": str(logs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of chaos")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kill-min", type=float, default=2.0)
    parser.add_argument("--kill-max", type=float, default=5.0, help="0 disables the kills")
    parser.add_argument(
        "--restart-postgres",
        metavar="VERSION/NAME",
        help="restart this Debian cluster (pg_lsclusters) once mid-run, e.g. 15/main",
    )
    parser.add_argument(
        "--skew", action="append", default=[], help="add a worker under faketime -f SKEW, e.g. +90s"
    )
    parser.add_argument("--extra-jobs", type=int, default=0, help="more every-second jobs")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    report = check(
        args.database_url,
        duration=args.duration,
        workers=args.workers,
        kill_min=args.kill_min,
        kill_max=args.kill_max,
        restart_pg=args.restart_postgres,
        skewed=args.skew,
        extra_jobs=args.extra_jobs,
        seed=args.seed,
    )
    print(json.dumps(report, indent=2))
    sys.exit(0 if report["missed"] == 0 and report["extra"] == 0 else 1)


if __name__ == "__main__":
    main()
