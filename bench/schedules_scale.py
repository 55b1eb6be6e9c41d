"""Schedules kept as data at scale: N schedules (one per tenant, zones spread over the world)
on W worker processes.

On a database of its own (created on --database-url's server, dropped at the end):

1. N schedules are added through `app.schedules.add` (eight at a time; cron --cron, by
   default each tenant hourly at a minute of its own, each in the next zone of the IANA list,
   a task target), timed.
2. W processes of `python -m oncely worker --concurrency 0` start (they run the schedules'
   slots, which enqueue the task in the slot's transaction, and no tasks: the scheduler's own
   cost is what is measured). The backlog of slots that came due while the schedules were
   being added is worked off first, and not counted.
3. Over --minutes whole minutes, every slot that came due: claimed once (a claim per
   schedule and slot, each with exactly one task enqueued with it), fire latency (claim time
   minus slot time: p50 / p99 / max), and per second, the workers' CPU (from /proc) and the
   database's transactions (pg_stat_database xact_commit + xact_rollback of its database).
   The idle cost is read from the seconds between the end of a minute's burst of slots and
   the next minute: what W workers cost while 10,000 schedules are stored and none is due.
4. How the scheduler finds due schedules: EXPLAIN of its statement (an index range on the
   partial index oncely_schedules_due, never the whole table).

    python bench/schedules_scale.py                          # 10,000 schedules, 3 workers, 3 min
    python bench/schedules_scale.py --schedules 200 --workers 2 --minutes 1   # the smoke run

Not a test: it never gates on a time. The machine it runs on may be shared and loaded; the
report says how many cores it had and its load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import zoneinfo
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
APP = "bench.schedules_app:app"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _sync(url: str, database: str | None = None) -> sa.Engine:
    parsed = make_url(url).set(drivername="postgresql+psycopg2")
    if database is not None:
        parsed = parsed.set(database=database)
    return sa.create_engine(parsed, isolation_level="AUTOCOMMIT")


def _zones() -> list[str]:
    return sorted(z for z in zoneinfo.available_timezones() if "/" in z and "Etc" not in z)


async def _add(url: str, n: int, expr: str, every: int | None) -> float:
    sys.path.insert(0, str(ROOT))
    from bench.schedules_app import app

    app.use_database(url)
    await app.migrate()
    zones = _zones()
    started = time.perf_counter()
    gate = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with gate:
            await app.schedules.add(
                f"tenant-{i:05d}",
                cron=None if every else expr.format(m=i % 60),
                every=every,
                tz=zones[i % len(zones)],
                task="digest",
                args={"tenant": f"t{i}"},
                by="bench",
            )

    await asyncio.gather(*(one(i) for i in range(n)))
    elapsed = time.perf_counter() - started
    await app.aclose()
    return elapsed


def _expected(args: argparse.Namespace, first: datetime, last: datetime) -> int:
    """How many slots of the N schedules fall in [first, last] (zones do not move a minute)."""
    sys.path.insert(0, str(ROOT / "src"))
    from oncely.schedule import Schedule, cron, every

    zones = _zones()
    count = 0
    for i in range(args.schedules):
        schedule: Schedule = (
            every(seconds=args.every)
            if args.every
            else cron(args.cron.format(m=i % 60), tz=zones[i % len(zones)])
        )
        count += sum(1 for _ in schedule.slots_between(first - timedelta(microseconds=1), last))
    return count


def _cpu(pids: list[int]) -> float:
    """Seconds of CPU (user + system) the processes used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


class Sampler(threading.Thread):
    """Every second: (time, the workers' CPU seconds, the database's transactions)."""

    def __init__(self, engine: sa.Engine, database: str, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.engine, self.database, self.pids = engine, database, pids
        self.samples: list[tuple[float, float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        query = sa.text(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = :d"
        )
        with self.engine.connect() as conn:
            while not self.stop.is_set():
                conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
                xacts = int(conn.execute(query, {"d": self.database}).scalar_one())
                self.samples.append((time.time(), _cpu(self.pids), xacts))
                self.stop.wait(1.0)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _idle(
    samples: list[tuple[float, float, int]], quiet: list[tuple[float, float]]
) -> dict[str, Any]:
    """CPU and transactions per second over the quiet intervals (no slot due)."""
    seconds = cpu = xacts = 0.0
    for start, end in quiet:
        inside = [s for s in samples if start <= s[0] <= end]
        if len(inside) < 2:
            continue
        seconds += inside[-1][0] - inside[0][0]
        cpu += inside[-1][1] - inside[0][1]
        xacts += inside[-1][2] - inside[0][2]
    if seconds <= 0:
        return {"seconds": 0, "cpu_percent": None, "transactions_per_s": None}
    return {
        "seconds": round(seconds, 1),
        "cpu_percent_all_workers": round(100 * cpu / seconds, 2),
        "transactions_per_s_all_workers": round(xacts / seconds, 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    database = f"oncely_bench_schedules_{os.getpid()}"
    admin = _sync(args.database_url)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{database}"')
    url = make_url(args.database_url).set(database=database).render_as_string(False)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        add_s = asyncio.run(_add(url, args.schedules, args.cron, args.every))
        print(f"added {args.schedules} schedules in {add_s:.1f} s", file=sys.stderr)
        env = {**os.environ, "ONCELY_DATABASE_URL": url, "ONCELY_APP": APP}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
        logs = Path(args.logs)
        logs.mkdir(parents=True, exist_ok=True)
        for i in range(args.workers):
            with (logs / f"worker-{i}.log").open("w") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "oncely", "worker", "--concurrency", "0"],
                        env=env,
                        cwd=ROOT,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        db = _sync(args.database_url, database)
        sampler = Sampler(db, database, [p.pid for p in procs])
        sampler.start()
        # The slots that came due while the schedules were being added are a backlog the
        # workers catch up first: measure from the minute after it is worked off.
        due = sa.text(
            "SELECT count(*) FROM oncely_schedules WHERE state = 'active' AND next_slot <= now()"
        )
        deadline = time.time() + 600
        with db.connect() as conn:
            while time.time() < deadline and conn.execute(due).scalar_one() > 0:
                time.sleep(1.0)  # polling the backlog, with a deadline
        settle = time.time() + args.settle
        period = args.every or 60  # seconds between a schedule's slots (cron: each minute)
        start = int(settle) // period * period + period
        first = datetime.fromtimestamp(start, timezone.utc)
        last = first + timedelta(seconds=period * (args.minutes - 1))
        end = last + timedelta(seconds=period)
        while time.time() < end.timestamp():
            time.sleep(0.5)  # the measured window: the workers run meanwhile
        sampler.stop.set()
        sampler.join()
        with db.connect() as conn:
            claims = conn.execute(
                sa.text(
                    "SELECT job, key, scheduled_for, claimed_at FROM oncely_runs "
                    "WHERE scheduled_for >= :a AND scheduled_for <= :b"
                ),
                {"a": first, "b": last},
            ).all()
            tasks = conn.execute(
                sa.text(
                    "SELECT idempotency_key, count(*) FROM oncely_tasks "
                    "WHERE idempotency_key IS NOT NULL GROUP BY idempotency_key"
                )
            ).all()
            plan = conn.execute(
                sa.text(
                    "EXPLAIN SELECT * FROM oncely_schedules WHERE state = 'active' "
                    "AND next_slot <= now() ORDER BY next_slot LIMIT 200"
                )
            ).all()
        per_task = {k: n for k, n in tasks}
        expected = _expected(args, first, last)
        keys = {(job, key) for job, key, _s, _c in claims}
        latency = [(c - s).total_seconds() for _j, _k, s, c in claims]
        one_task = sum(1 for job, key, _s, _c in claims if per_task.get(f"{job}:{key}") == 1)
        bursts = {}
        for _j, _k, s, c in claims:
            bursts[s] = max(bursts.get(s, s), c)
        quiet = [
            (done.timestamp() + 1.0, (slot + timedelta(seconds=period)).timestamp() - 1.0)
            for slot, done in sorted(bursts.items())
        ]
        quiet = [(a, b) for a, b in quiet if b > a]
        with admin.connect() as conn:
            server = conn.execute(sa.text("SHOW server_version")).scalar_one()
        return {
            "schedules": args.schedules,
            "workers": args.workers,
            "cron": None if args.every else args.cron,
            "every_s": args.every,
            "zones": min(args.schedules, len(_zones())),
            "add_seconds": round(add_s, 1),
            "window": [first.isoformat(), end.isoformat()],
            "slots_due": expected,
            "slots_claimed": len(claims),
            "claimed_once": len(keys) == len(claims),
            "slots_with_one_task": one_task,
            "duplicate_tasks": sum(1 for n in per_task.values() if n > 1),
            "latency_s": {
                "p50": _percentile(latency, 0.50),
                "p99": _percentile(latency, 0.99),
                "max": max(latency) if latency else None,
                "mean": round(statistics.fmean(latency), 3) if latency else None,
            },
            "idle": _idle(sampler.samples, quiet),
            "due_query_plan": [row[0] for row in plan],
            "exit_codes": _stop(procs),
            "machine": {
                "cores": os.cpu_count(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "postgres": server,
            },
        }
    finally:
        _stop(procs)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.dispose()


def _stop(procs: list[subprocess.Popen[bytes]]) -> list[int | None]:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=60))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--minutes",
        type=int,
        default=3,
        help="Whole minutes measured (with --every: whole intervals measured).",
    )
    parser.add_argument(
        "--every",
        type=int,
        default=None,
        help="Seconds: every schedule an interval of this many seconds instead of --cron "
        "(the smoke run: a burst of every schedule's slot each interval).",
    )
    parser.add_argument(
        "--cron",
        default="{m} * * * *",
        help="Each schedule's expression; {m} is the tenant's minute (its number mod 60): by "
        "default each tenant hourly at a minute of its own; '* * * * *' fires all at once.",
    )
    parser.add_argument("--settle", type=float, default=10.0, help="Seconds before measuring.")
    parser.add_argument("--database-url", default=os.environ.get("ONCELY_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--logs", default="/tmp/oncely-bench-schedules", help="Workers' logs.")
    parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
    args = parser.parse_args()
    for name in ("schedules", "workers", "minutes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.every is not None and args.every < 1:
        parser.error("--every must be at least 1 (seconds)")
    if args.settle < 0:
        parser.error("--settle must be >= 0")
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for key, value in report.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
