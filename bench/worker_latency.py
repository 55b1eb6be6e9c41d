"""Fire latency and idle cost of `oncely worker`.

1. Fire latency: N workers (default 4) on one database run an `every(seconds=1)` job; for
   the first S slots (default 100) take the winning attempt's start minus the slot's nominal
   time (the `latency_ms` field of `run.ran`) and print p50 / p99 / max.
2. Idle cost: one worker with J registered cron jobs (default 1000) none of which is due;
   after it settles, RSS and CPU use over a window (default 30 s).

    python bench/worker_latency.py --database-url sqlite:////tmp/bench.db
    python bench/worker_latency.py --database-url postgresql://postgres@127.0.0.1/bench

Targets (issue 3): p99 < 20 ms, idle CPU < 1 %. Not a test: it never gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance import ROOT, Fleet, percentile, prepare, read_rows  # type: ignore[import-not-found]

_LATENCY = re.compile(r"run\.ran: .* slot=(\S+) .*latency_ms=([-0-9.]+)")


def fire_latency(url: str, workers: int, slots: int) -> dict[str, object]:
    prepare(url)
    logs = Path(tempfile.mkdtemp(prefix="oncely-latency-"))
    fleet = Fleet(url, logs)
    for _ in range(workers):
        fleet.start()
    deadline = time.monotonic() + slots + 60
    while time.monotonic() < deadline and len(read_rows(url)[0]) < slots:
        time.sleep(0.5)
    fleet.stop()
    by_slot: list[tuple[str, float]] = []
    for log in sorted(logs.glob("*.log")):
        by_slot += [(slot, float(ms)) for slot, ms in _LATENCY.findall(log.read_text())]
    latencies = [ms for _, ms in sorted(by_slot)[:slots]]
    return {
        "workers": workers,
        "slots": len(latencies),
        "p50_ms": round(percentile(latencies, 0.5), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "max_ms": round(max(latencies, default=0.0), 2),
    }


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def idle_cost(url: str, jobs: int, window: float) -> dict[str, object]:
    prepare(url)
    env = {
        **os.environ,
        "ONCELY_DATABASE_URL": url,
        "ONCELY_APP": "bench.idle_app:app",
        "ONCELY_BENCH_JOBS": str(jobs),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    log = Path(tempfile.mkdtemp(prefix="oncely-idle-")) / "worker.log"
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "oncely", "worker"],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    while "worker.started" not in log.read_text():
        if proc.poll() is not None or time.monotonic() - began > 60:
            raise SystemExit(f"the worker did not start:\n{log.read_text()}")
        time.sleep(0.05)
    startup = time.monotonic() - began
    time.sleep(2.0)  # let the first planning pass finish
    cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
    time.sleep(window)
    cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
    rss = _rss_mb(proc.pid)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
    return {
        "jobs": jobs,
        "startup_s": round(startup, 2),
        "window_s": window,
        "cpu_percent": round(100 * (cpu1 - cpu0) / (t1 - t0), 3),
        "rss_mb": round(rss, 1),
        "exit_code": code,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--window", type=float, default=30.0)
    args = parser.parse_args()
    report = {
        "fire_latency": fire_latency(args.database_url, args.workers, args.slots),
        "idle": idle_cost(args.database_url, args.jobs, args.window),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
