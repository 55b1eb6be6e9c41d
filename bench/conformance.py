"""Conformance checker for the worker (after the Jepsen analysis of Chronos).

Runs N `oncely worker` processes on one database for an `every(seconds=1)` job that inserts
one row per call (tests/apps/ticker.py), SIGKILLs a random worker every few seconds and
starts a new one, optionally restarts Postgres once mid-run, then stops every worker with
SIGTERM and matches each expected slot of the run window to the rows:

  missed  expected slots with no row          (must be 0: a worker was alive throughout)
  extra   duplicate rows + rows off the grid   (must be 0: once per slot)

    python bench/conformance.py --database-url postgresql://postgres@127.0.0.1/oncely_soak \
        --duration 600 --workers 4 --restart-postgres

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
APP = "tests.apps.ticker:app"
DDL = (
    "CREATE TABLE IF NOT EXISTS ticks (slot varchar(64) NOT NULL, "
    "replica varchar(255) NOT NULL, ran_at varchar(64) NOT NULL)"
)


def sync_engine(url: str) -> sa.Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        return sa.create_engine(parsed.set(drivername="postgresql+psycopg2"))
    return sa.create_engine(parsed.set(drivername="sqlite"))


def env_for(url: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "ONCELY_DATABASE_URL": url, "ONCELY_APP": APP, "PYTHONPATH": path}


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

    def __init__(self, url: str, logs: Path, prefix: list[str] | None = None) -> None:
        self.url = url
        self.logs = logs
        self.prefix = prefix or []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def start(self, prefix: list[str] | None = None) -> subprocess.Popen[bytes]:
        self.started += 1
        log = (self.logs / f"worker-{self.started:03d}.log").open("wb")
        cmd = [*(prefix or self.prefix), sys.executable, "-m", "oncely", "worker"]
        proc = subprocess.Popen(cmd, env=env_for(self.url), cwd=ROOT, stdout=log, stderr=log)
        self.procs.append(proc)
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


def restart_postgres() -> float:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    began = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
    )
    return time.monotonic() - began


def read_rows(url: str) -> tuple[list[tuple[str, str, str]], int]:
    engine = sync_engine(url)
    deadline = time.monotonic() + 60
    while True:
        try:
            with engine.connect() as conn:
                rows = [
                    tuple(r)
                    for r in conn.execute(sa.text("SELECT slot, replica, ran_at FROM ticks"))
                ]
                claims = conn.execute(
                    sa.text("SELECT count(*) FROM oncely_runs WHERE job = 'tick'")
                ).scalar_one()
            engine.dispose()
            return rows, int(claims)
        except sa.exc.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def wait_first_row(url: str, deadline: float) -> datetime:
    engine = sync_engine(url)
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                first = conn.execute(sa.text("SELECT min(slot) FROM ticks")).scalar()
            if first:
                return datetime.fromisoformat(first)
            time.sleep(0.05)
    finally:
        engine.dispose()
    raise SystemExit("no worker ran a slot within the deadline")


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
    restart_pg: bool = False,
    skewed: list[str] | None = None,
    seed: int | None = None,
    logs: Path | None = None,
) -> dict[str, object]:
    """Run the scenario and return the report (see the module docstring)."""
    rng = random.Random(seed)
    logs = logs or Path(tempfile.mkdtemp(prefix="oncely-conformance-"))
    prepare(url)
    fleet = Fleet(url, logs)
    for _ in range(workers):
        fleet.start()
    for offset in skewed or []:
        fleet.start(["faketime", "-f", offset])
    first = wait_first_row(url, time.monotonic() + 60)
    began = time.monotonic()
    kills = 0
    pg_restart_s = None
    restart_at = began + duration / 2 if restart_pg else None
    next_kill = began + rng.uniform(kill_min, kill_max)
    while time.monotonic() - began < duration:
        now = time.monotonic()
        if restart_at is not None and now >= restart_at:
            pg_restart_s = round(restart_postgres(), 2)
            restart_at = None
        if now >= next_kill and kill_max > 0:
            normal = [p for p in fleet.alive() if p.args[0] == sys.executable]
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
    rows, claims = read_rows(url)
    window_end = stop_at.replace(microsecond=0) - timedelta(seconds=1)
    expected = set()
    slot = first
    while slot <= window_end:
        expected.add(slot)
        slot += timedelta(seconds=1)
    counts = Counter(datetime.fromisoformat(s) for s, _, _ in rows)
    duplicates = sum(c - 1 for c in counts.values())
    off_grid = sum(1 for s in counts if s.microsecond or (s - first).total_seconds() % 1)
    missed = sorted(s for s in expected if s not in counts)
    latencies = [
        (datetime.fromisoformat(ran) - datetime.fromisoformat(s)).total_seconds() * 1000
        for s, _, ran in rows
    ]
    return {
        "database": make_url(url).get_backend_name(),
        "duration_s": duration,
        "workers": workers,
        "skewed": skewed or [],
        "expected": len(expected),
        "rows": len(rows),
        "claims": claims,
        "missed": len(missed),
        "missed_slots": [s.isoformat() for s in missed[:20]],
        "extra": duplicates + off_grid,
        "duplicates": duplicates,
        "off_grid": off_grid,
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
    parser.add_argument("--restart-postgres", action="store_true")
    parser.add_argument(
        "--skew", action="append", default=[], help="add a worker under faketime -f SKEW, e.g. +90s"
    )
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
        seed=args.seed,
    )
    print(json.dumps(report, indent=2))
    sys.exit(0 if report["missed"] == 0 and report["extra"] == 0 else 1)


if __name__ == "__main__":
    main()
