"""Idle cost at scale: what idle `oncely worker` processes send to Postgres, and how fast one
of them starts a task enqueued while they are idle.

By default on a Postgres cluster of its own (pg_createcluster on a free port, with
pg_stat_statements loaded; dropped at the end), so that nothing else's statements count:

1. Idle: --workers processes of `python -m oncely worker --concurrency C` (an app with three
   yearly cron jobs and three tasks, bench/idle_workers_app.py) on one database, started and
   settled; then over --window seconds: the statements they sent (pg_stat_statements calls,
   by statement text), the transactions (pg_stat_database xact_commit + xact_rollback), the
   new server sessions, and the CPU time of the cluster's processes and of the workers.
2. Wake-up: --probes tasks enqueued one at a time (one transaction each, through the task's
   `enqueue` on an AsyncSession), --spacing seconds apart (jittered) so that every worker is
   idle again in between; each probe records time.time() when its attempt starts, and the
   latency is that minus the enqueuer's time.time() right after its COMMIT returned (the
   same machine's clock). p50 / p99 / max, and the statements sent per probe.
3. The floor, once the workers stopped: as many processes that only LISTEN (raw asyncpg),
   the same probes each a transaction whose pg_notify names one of them, and the latency
   from its COMMIT returned to that one's callback: what waking a worker by a notification
   costs on this machine before the worker does anything.

    python bench/idle.py                              # 20 workers, a 60 s window, 200 probes
    python bench/idle.py --workers 2 --window 3 --probes 10      # the smoke run's size
    python bench/idle.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
        # a database of its own on that server instead of a cluster (dropped at the end);
        # pg_stat_statements is used only if that server loads it

Goal (issue 17): an idle worker sends at most ~1 statement per second in total, and a task
enqueued is started within p99 <= 5 ms. Not a test: it never gates CI on a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from idle_workers_app import PROBES_DDL  # type: ignore[import-not-found]  # noqa: E402

from oncely import Oncely  # noqa: E402

APP = "bench.idle_workers_app:app"
DATABASE = "oncely_idle"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _version() -> str:
    versions = sorted(
        (p.name for p in Path("/usr/lib/postgresql").glob("*") if (p / "bin").is_dir()),
        key=lambda v: [int(x) for x in v.split(".")],
    )
    if not versions or shutil.which("pg_createcluster") is None:
        raise SystemExit("bench/idle.py: no pg_createcluster here; pass --database-url instead")
    return versions[-1]


@contextmanager
def own_cluster() -> Iterator[tuple[str, int | None]]:
    """A Postgres cluster of this run's own (trust on 127.0.0.1, pg_stat_statements loaded):
    its admin URL and its postmaster's pid; dropped on exit."""
    version, name, port = _version(), f"oncely_idle_{os.getpid()}", _free_port()
    options = [
        "shared_preload_libraries=pg_stat_statements",
        "max_connections=500",
    ]
    cmd = ["pg_createcluster", version, name, "-p", str(port), "--start"]
    for option in options:
        cmd += ["-o", option]
    made = subprocess.run([*cmd, "--", "-A", "trust"], capture_output=True, text=True)
    try:
        if made.returncode != 0:
            raise SystemExit(f"pg_createcluster failed:\n{made.stdout}{made.stderr}")
        data = Path(f"/var/lib/postgresql/{version}/{name}")
        pid_file = data / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
        print(f"cluster: {version}/{name} on port {port}", file=sys.stderr)
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", postmaster
    finally:
        subprocess.run(
            ["pg_dropcluster", version, name, "--stop"], capture_output=True, check=False
        )


def _sync(url: str, database: str | None = None) -> sa.Engine:
    parsed = make_url(url).set(drivername="postgresql+psycopg2")
    if database is not None:
        parsed = parsed.set(database=database)
    return sa.create_engine(parsed, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def _async_url(url: str) -> str:
    return (
        make_url(url)
        .set(drivername="postgresql+asyncpg", database=DATABASE)
        .render_as_string(hide_password=False)
    )


# -- what the server and the workers did ------------------------------------------------------


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _children(parent: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            pids.append(int(stat.parent.name))
    return pids


class Observer:
    """Reads the server's counters from the `postgres` database (not counted: only the
    bench database's statements are)."""

    def __init__(self, admin: sa.Engine, postmaster: int | None) -> None:
        self.admin = admin
        self.postmaster = postmaster
        with admin.connect() as conn:
            self.statements = bool(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
                    )
                ).scalar()
            )
            self.dbid = conn.execute(
                sa.text("SELECT oid FROM pg_database WHERE datname = :d"), {"d": DATABASE}
            ).scalar()

    def reset(self) -> None:
        if self.statements:
            with self.admin.connect() as conn:
                conn.execute(sa.text("SELECT pg_stat_statements_reset()"))

    def snapshot(self) -> dict[str, Any]:
        with self.admin.connect() as conn:
            xacts, sessions = conn.execute(
                sa.text(
                    "SELECT xact_commit + xact_rollback, sessions FROM pg_stat_database"
                    " WHERE datname = :d"
                ),
                {"d": DATABASE},
            ).one()
            backends = [
                pid
                for (pid,) in conn.execute(
                    sa.text("SELECT pid FROM pg_stat_activity WHERE datname = :d"), {"d": DATABASE}
                )
            ]
        server = [self.postmaster, *_children(self.postmaster)] if self.postmaster else []
        return {
            "at": time.monotonic(),
            "xacts": int(xacts),
            "sessions": int(sessions),
            "backends": {pid: _cpu(pid) for pid in backends},
            "server": {pid: _cpu(pid) for pid in server},
        }

    def statement_counts(self) -> list[dict[str, Any]]:
        if not self.statements:
            return []
        with self.admin.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT calls, total_exec_time, query FROM pg_stat_statements"
                    " WHERE dbid = :dbid ORDER BY calls DESC"
                ),
                {"dbid": self.dbid},
            ).all()
        return [
            {"calls": int(c), "exec_ms": round(float(t), 2), "query": " ".join(q.split())[:160]}
            for c, t, q in rows
        ]


def _cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


# -- the workers ------------------------------------------------------------------------------


class Workers:
    def __init__(self, url: str, count: int, concurrency: int, logs: Path) -> None:
        env = {
            **os.environ,
            "ONCELY_DATABASE_URL": url,
            "ONCELY_APP": APP,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
            ),
        }
        self.logs = logs
        self.procs = []
        for n in range(count):
            log = (logs / f"worker-{n}.log").open("wb")
            cmd = [sys.executable, "-m", "oncely", "worker", "--concurrency", str(concurrency)]
            self.procs.append(
                subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            )

    def cpu(self) -> float:
        return sum(_cpu(p.pid) for p in self.procs)

    def wait_announced(self, db: sa.Engine, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise SystemExit(f"a worker exited ({dead[0].returncode}):\n{self.tail()}")
            with db.connect() as conn:
                seen = conn.execute(sa.text("SELECT count(*) FROM oncely_workers")).scalar()
            if seen == len(self.procs):
                return
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"only {seen} of {len(self.procs)} workers started:\n{self.tail()}"
                )
            time.sleep(0.2)

    def tail(self) -> str:
        logs = sorted(self.logs.glob("worker-*.log"))
        return logs[0].read_text()[-3000:] if logs else ""

    def stop(self) -> list[int | None]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        return codes


# -- the two measurements ---------------------------------------------------------------------


def idle(observer: Observer, workers: Workers, window: float) -> dict[str, Any]:
    observer.reset()
    before, wcpu = observer.snapshot(), workers.cpu()
    time.sleep(window)
    after, wcpu = observer.snapshot(), workers.cpu() - wcpu
    elapsed = after["at"] - before["at"]
    statements = observer.statement_counts()
    n = len(workers.procs)
    calls = sum(s["calls"] for s in statements)
    return {
        "window_s": round(elapsed, 1),
        "statements": calls,
        "statements_per_s_per_worker": round(calls / elapsed / n, 3)
        if observer.statements
        else None,
        "xacts_per_s_per_worker": round((after["xacts"] - before["xacts"]) / elapsed / n, 3),
        "new_sessions": after["sessions"] - before["sessions"],
        "backends": len(after["backends"]),
        "backend_cpu_percent": round(
            100 * _cpu_delta(before["backends"], after["backends"]) / elapsed, 3
        ),
        "server_cpu_percent": round(
            100 * _cpu_delta(before["server"], after["server"]) / elapsed, 3
        )
        if observer.postmaster
        else None,
        "worker_cpu_percent_each": round(100 * wcpu / elapsed / n, 3),
        "by_statement": statements,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _enqueue_probes(url: str, probes: int, spacing: float) -> dict[int, tuple[float, float]]:
    app = Oncely(url)

    @app.task(name="probe")
    async def probe(db, seq: int):  # type: ignore[no-untyped-def]
        return None

    engine = create_async_engine(url)
    committed: dict[int, tuple[float, float]] = {}
    rng = random.Random(17)
    try:
        async with AsyncSession(engine) as db:  # warm: a connection, the statement prepared
            await db.execute(sa.text("SELECT 1"))
            await db.commit()
            for seq in range(probes):
                await asyncio.sleep(spacing * rng.uniform(0.5, 1.5))
                await probe.enqueue(db, seq=seq)
                sent = time.time()
                await db.commit()
                committed[seq] = (sent, time.time())
    finally:
        await engine.dispose()
        await app.aclose()
    return committed


def wake_up(
    observer: Observer, db: sa.Engine, url: str, probes: int, spacing: float
) -> dict[str, Any]:
    observer.reset()
    committed = asyncio.run(_enqueue_probes(_async_url(url), probes, spacing))
    deadline = time.monotonic() + 60 + probes * 0.1
    while True:
        with db.connect() as conn:
            rows = {
                seq: (started, pid)
                for seq, started, pid in conn.execute(
                    sa.text("SELECT seq, started, pid FROM idle_probes")
                )
            }
        if len(rows) >= probes or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    statements = observer.statement_counts()
    after = [1000 * (rows[s][0] - committed[s][1]) for s in rows]
    before = [1000 * (rows[s][0] - committed[s][0]) for s in rows]
    return {
        "probes": probes,
        "started": len(rows),
        "workers_that_ran_one": len({pid for _, pid in rows.values()}),
        "p50_ms": round(statistics.median(after), 2) if after else None,
        "p99_ms": round(percentile(after, 0.99), 2) if after else None,
        "max_ms": round(max(after), 2) if after else None,
        "p99_from_commit_sent_ms": round(percentile(before, 0.99), 2) if before else None,
        "statements_per_probe": round(sum(s["calls"] for s in statements) / probes, 1)
        if observer.statements
        else None,
        "by_statement": statements,
    }


# -- the floor: LISTEN/NOTIFY alone -------------------------------------------------------------

FLOOR_CHANNEL = "oncely_idle_floor"


def _floor_listener(dsn: str, place: int, heard: Any, ready: Any) -> None:
    """One process LISTENing on asyncpg, as a worker's listener does, and nothing else: it
    notes the time a notification naming its place arrives (sent on to the bench later)."""
    import asyncpg

    async def main() -> None:
        conn = await asyncpg.connect(dsn)

        def callback(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            target, _, seq = payload.partition(":")
            if int(target) == place:
                heard.put((int(seq), time.time()))

        await conn.add_listener(FLOOR_CHANNEL, callback)
        ready.put(place)
        await asyncio.Event().wait()  # until terminated

    asyncio.run(main())


def floor(url: str, listeners: int, probes: int, spacing: float) -> dict[str, Any]:
    """The same probes as `wake_up`, sent to `listeners` processes that only LISTEN (raw
    asyncpg, no oncely): each probe a transaction whose pg_notify names one of them, and the
    latency from its COMMIT returned to that process's callback. What any design that wakes
    workers by a notification on one channel pays on this machine before its first
    statement: the workers' own cost is the difference."""
    import multiprocessing

    import asyncpg

    dsn = _async_url(url).replace("postgresql+asyncpg://", "postgresql://")
    context = multiprocessing.get_context("spawn")
    heard, ready = context.Queue(), context.Queue()
    procs = [
        context.Process(target=_floor_listener, args=(dsn, i, heard, ready), daemon=True)
        for i in range(listeners)
    ]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=60)

        async def send() -> dict[int, float]:
            conn = await asyncpg.connect(dsn)
            rng = random.Random(17)
            sent: dict[int, float] = {}
            try:
                for seq in range(probes):
                    await asyncio.sleep(spacing * rng.uniform(0.5, 1.5))
                    async with conn.transaction():
                        await conn.execute(
                            "SELECT pg_notify($1, $2)", FLOOR_CHANNEL, f"{seq % listeners}:{seq}"
                        )
                    sent[seq] = time.time()
            finally:
                await conn.close()
            return sent

        sent = asyncio.run(send())
        got: dict[int, float] = {}
        while len(got) < probes:
            seq, at = heard.get(timeout=30)
            got[seq] = at
    finally:
        for proc in procs:
            proc.terminate()
            proc.join(10)
    after = [1000 * (got[s] - sent[s]) for s in got]
    return {
        "listeners": listeners,
        "probes": probes,
        "received": len(got),
        "p50_ms": round(statistics.median(after), 2),
        "p99_ms": round(percentile(after, 0.99), 2),
        "max_ms": round(max(after), 2),
    }


# -- the run ----------------------------------------------------------------------------------


def run(args: argparse.Namespace, admin_url: str, postmaster: int | None) -> dict[str, Any]:
    admin = _sync(admin_url)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{DATABASE}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{DATABASE}"'))
        with_statements = bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_stat_statements'"
                )
            ).scalar()
        ) and "pg_stat_statements" in str(
            conn.execute(sa.text("SHOW shared_preload_libraries")).scalar()
        )
        if with_statements:
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
    url = make_url(admin_url).set(database=DATABASE).render_as_string(hide_password=False)
    db = _sync(admin_url, DATABASE)
    logs = Path(tempfile.mkdtemp(prefix="oncely-idle-"))
    workers: Workers | None = None
    try:
        env = {**os.environ, "ONCELY_DATABASE_URL": url, "ONCELY_APP": APP}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
        migrated = subprocess.run(
            [sys.executable, "-m", "oncely", "migrate"], env=env, cwd=ROOT, capture_output=True
        )
        if migrated.returncode != 0:
            raise SystemExit(migrated.stderr.decode())
        with db.connect() as conn:
            conn.execute(sa.text(PROBES_DDL))
        observer = Observer(admin, postmaster)
        workers = Workers(url, args.workers, args.concurrency, logs)
        workers.wait_announced(db, timeout=60 + 3 * args.workers)
        time.sleep(args.settle)
        report: dict[str, Any] = {
            "workers": args.workers,
            "concurrency": args.concurrency,
            "own_cluster": args.database_url is None,
            "idle": idle(observer, workers, args.window),
        }
        report["wake_up"] = wake_up(observer, db, url, args.probes, args.spacing)
        report["exit_codes"] = workers.stop()
        report["floor"] = floor(url, args.workers, args.probes, args.spacing)
        return report
    finally:
        if workers is not None:
            workers.stop()
        db.dispose()
        if args.database_url is not None:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
        admin.dispose()


def render(report: dict[str, Any]) -> str:
    i, w, f = report["idle"], report["wake_up"], report["floor"]
    ratio = f"{w['p99_ms'] / f['p99_ms']:.2f}x" if w["p99_ms"] and f["p99_ms"] else "n/a"
    lines = [
        f"{report['workers']} idle workers, --concurrency {report['concurrency']}, "
        f"window {i['window_s']} s ({'own cluster' if report['own_cluster'] else 'shared server'})",
        "",
        "| measure | value |",
        "|---|---|",
        f"| statements /s per worker (pg_stat_statements) | {i['statements_per_s_per_worker']} |",
        f"| transactions /s per worker (pg_stat_database) | {i['xacts_per_s_per_worker']} |",
        f"| new server sessions in the window | {i['new_sessions']} |",
        f"| server backends | {i['backends']} |",
        f"| their CPU, % of one core | {i['backend_cpu_percent']} |",
        f"| the whole cluster's CPU, % of one core | {i['server_cpu_percent']} |",
        f"| each worker's own CPU, % of one core | {i['worker_cpu_percent_each']} |",
        f"| probes started / enqueued | {w['started']} / {w['probes']} |",
        f"| wake-up p50 / p99 / max, ms | {w['p50_ms']} / {w['p99_ms']} / {w['max_ms']} |",
        f"| wake-up p99 from the COMMIT sent, ms | {w['p99_from_commit_sent_ms']} |",
        f"| statements per probe (all workers) | {w['statements_per_probe']} |",
        f"| workers that ran a probe | {w['workers_that_ran_one']} |",
        f"| LISTEN/NOTIFY alone, {f['listeners']} asyncpg processes: p50 / p99 / max, ms "
        f"| {f['p50_ms']} / {f['p99_ms']} / {f['max_ms']} |",
        f"| wake-up p99 / LISTEN/NOTIFY alone p99 | {ratio} |",
        "",
        "statements in the idle window, by text:",
        "",
        "| calls | exec ms | statement |",
        "|---|---|---|",
    ]
    lines += [
        f"| {s['calls']} | {s['exec_ms']} | `{s['query'].replace('|', '/')}` |"
        for s in i["by_statement"]
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--window", type=float, default=60.0, help="idle window, seconds")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after all started")
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--spacing", type=float, default=0.05, help="seconds between probes")
    parser.add_argument("--database-url", help="a server to use instead of an own cluster")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    for name in ("workers", "concurrency", "probes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    for name in ("window", "spacing"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be > 0")
    if args.settle < 0:
        parser.error("--settle must be >= 0")
    if args.database_url is not None:
        report = run(args, args.database_url, None)
    else:
        with own_cluster() as (admin_url, postmaster):
            report = run(args, admin_url, postmaster)
    print(json.dumps(report, indent=2) if args.json else render(report))


if __name__ == "__main__":
    main()
