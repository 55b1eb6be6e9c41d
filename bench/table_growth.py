"""Flat cost as the tables grow: oncely's rates and listings on full tables beside empty ones.

Two databases of their own on one server, in one run: one with empty tables, one filled with
set-based SQL (generate_series) to --claims claims in `oncely_runs` (100 jobs of hourly slots,
the newest an hour ago) and --finished finished tasks (98 % succeeded, 1 % dead, 1 % discarded,
ending over the last 90 days, a fifth with an idempotency key) plus --queued available tasks
(due over the next 30 days, so none is due during the run), then VACUUM ANALYZE (what
autovacuum does for a table that size). On each, the same measurements, the two databases
interleaved round by round so that a noisy neighbour slows both sides of a ratio:

  claim_run /s          BEGIN; claim_run(session, job, key); COMMIT on an AsyncSession (asyncpg)
  app.run /s            app.run of a no-op job (every second, `now` one second on each time)
  enqueue /s            one task per transaction on an AsyncSession
  one-row drain /s      --drain tasks that each insert a row, drained by one worker
                        (--concurrency lanes), from its start to the last row
  history ms            app.history(JOB, 50): what `oncely history JOB --limit 50` reads
  tasks dead ms         list_tasks(state=dead, limit=50): `oncely tasks --state dead --limit 50`
  tasks succeeded ms    the same for succeeded tasks
  last runs ms          app.last_runs(): the newest claim of each job (`oncely list`)
  newest slots ms       store.claims.last_slots(): what a starting worker's catch-up reads

and last, `prune --older-than 30d` (queue.prune) while a worker drains one-row tasks that a
producer keeps enqueuing: how long it takes, what it deleted, the longest transaction of its
own that pg_stat_activity showed (sampled every 10 ms), and the worker's rate and longest gap
between two tasks while it ran. The databases are dropped at the end.

    python bench/table_growth.py                  # the full size: about 15 min, 2-3 GB of disk
    python bench/table_growth.py --quick          # tiny sizes, a few seconds (the CI smoke run)
    python bench/table_growth.py --no-fsync       # commits without waiting for the disk
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import oncely  # noqa: E402
from oncely import Oncely, TaskState, every  # noqa: E402
from oncely.queue import consume, list_tasks, prune  # noqa: E402

PG_URL = os.environ.get(
    "ONCELY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
JOBS = 100
"""Jobs in the filled ledger; each has claims // JOBS hourly slots."""
HISTORY_JOB = "job_7"
PRUNE_AGE = timedelta(days=30)
EFFECTS = "CREATE TABLE bench_effects (n bigint NOT NULL)"

FILL_CLAIMS = """
    INSERT INTO oncely_runs (job, key, scheduled_for, claimed_at, claimed_by, finished_at)
    SELECT 'job_' || j, to_char(s.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), s.at,
           s.at + interval '0.2 s', 'bench:fill', s.at + interval '0.7 s'
    FROM generate_series(0, $1::int - 1) AS j,
         LATERAL (SELECT date_trunc('hour', now()) - make_interval(secs => (h + 1) * $3::float8)
                  AS at FROM generate_series(0, $2::int - 1) AS h) AS s
"""
SPAN_S = 400 * 86400.0
"""The filled claims' slots go back this far: hourly at the full size, wider apart if fewer."""
FILL_FINISHED = """
    INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, created_at,
                              idempotency_key, locked_by, started_at, finished_at, error)
    SELECT 'task_' || (i % 20), 'default', jsonb_build_object('n', i),
           CASE i % 100 WHEN 0 THEN 'dead' WHEN 1 THEN 'discarded' ELSE 'succeeded' END,
           CASE i % 100 WHEN 0 THEN 25 ELSE 1 END,
           e.at - interval '2 s', e.at - interval '2 s',
           CASE WHEN i % 5 = 0 THEN 'key:' || i END, 'bench:fill', e.at - interval '1 s', e.at,
           CASE WHEN i % 100 IN (0, 1) THEN 'RuntimeError: the payment gateway said no' END
    FROM generate_series(1, $1::int) AS i,
         LATERAL (SELECT now() - make_interval(secs => ($1::int - i) * (90 * 86400.0 / $1::int))
                  AS at) AS e
"""
FILL_QUEUED = """
    INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, created_at)
    SELECT 'task_' || (i % 20), 'default', jsonb_build_object('n', i), 'available', 0,
           now() + make_interval(secs => 3600 + i * (30 * 86400.0 / $1::int)), now()
    FROM generate_series(1, $1::int) AS i
"""


@dataclass
class Side:
    """One database: its app (a no-op job, a no-op task, a one-row task) and sessions."""

    name: str
    url: str
    app: Oncely
    sessions: async_sessionmaker[AsyncSession]
    engine: AsyncEngine
    raw: Any
    done: list[float] = field(default_factory=list)
    """perf_counter() at the end of each one-row task's work (the prune's drain)."""
    slots: Any = None
    keys: Any = None


@dataclass
class Rate:
    """A rate measured on both sides, round by round."""

    name: str
    empty: list[float] = field(default_factory=list)
    full: list[float] = field(default_factory=list)

    def ratio(self) -> tuple[float, float, float]:
        ratios = [f / e for f, e in zip(self.full, self.empty, strict=True)]
        return statistics.median(ratios), min(ratios), max(ratios)


def build_app(url: str, side: str, done: list[float]) -> Oncely:
    app = Oncely(url)

    @app.job(every(seconds=1), name="bench_app_run")
    async def bench_app_run(db: Any, now: datetime) -> None:
        return None

    @app.job(every(hours=1), name=HISTORY_JOB)  # the job whose history is listed
    async def listed(db: Any, now: datetime) -> None:
        return None

    @app.task(name="noop")
    async def noop(db: Any, n: int) -> None:
        return None

    insert = sa.text("INSERT INTO bench_effects (n) VALUES (:n)")

    @app.task(name="one_row")
    async def one_row(db: Any, n: int) -> None:
        await db.execute(insert, {"n": n})
        done.append(time.perf_counter())

    return app


async def create_side(admin: Any, base: str, name: str, durable: bool) -> Side:
    database = f"oncely_growth_{os.getpid()}_{name}"
    await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{database}"')
    if not durable:
        await admin.execute(f'ALTER DATABASE "{database}" SET synchronous_commit = off')
    url = make_url(base).set(drivername="postgresql", database=database)
    plain = url.render_as_string(hide_password=False)
    done: list[float] = []
    app = build_app(plain, name, done)
    await app.migrate()
    raw = await asyncpg.connect(plain)
    await raw.execute(EFFECTS)
    engine = create_async_engine(url.set(drivername="postgresql+asyncpg"))
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    side = Side(name, plain, app, sessions, engine, raw, done)
    side.slots = itertools.count()
    side.keys = itertools.count()
    return side


async def fill(side: Side, claims: int, finished: int, queued: int) -> dict[str, float]:
    """Fill the side's tables with set-based SQL; seconds per step."""
    took: dict[str, float] = {}
    per_job = max(1, claims // JOBS)
    for step, sql, args in (
        ("claims", FILL_CLAIMS, (JOBS, per_job, max(3600.0, SPAN_S / per_job))),
        ("finished tasks", FILL_FINISHED, (finished,)),
        ("queued tasks", FILL_QUEUED, (queued,)),
    ):
        started = time.perf_counter()
        if args[0]:
            await side.raw.execute(sql, *args)
        took[step] = time.perf_counter() - started
    started = time.perf_counter()
    await side.raw.execute("VACUUM ANALYZE oncely_runs")
    await side.raw.execute("VACUUM ANALYZE oncely_tasks")
    took["vacuum analyze"] = time.perf_counter() - started
    started = time.perf_counter()
    # The fill's writes reach the disk now, not during the first rounds (which they would
    # slow on whichever side was measured then).
    await side.raw.execute("CHECKPOINT")
    took["checkpoint"] = time.perf_counter() - started
    return took


# -- the measurements ---------------------------------------------------------------------

Step = Callable[[Side], Awaitable[None]]
BASE_SLOT = datetime(2020, 1, 1, tzinfo=timezone.utc)


async def claim_step(side: Side) -> None:
    async with side.sessions() as db, db.begin():
        if not await oncely.claim_run(db, "bench_claim", f"k{next(side.keys)}"):
            raise RuntimeError("claim_run lost a fresh key")


async def run_step(side: Side) -> None:
    now = BASE_SLOT + timedelta(seconds=next(side.slots))
    result = await side.app.run("bench_app_run", now=now)
    if result.status is not oncely.RunStatus.RAN:
        raise RuntimeError(f"app.run came back {result.status}, expected ran")


LATER = datetime(2100, 1, 1, tzinfo=timezone.utc)
"""When the enqueue rate's tasks are due: never during the run (the drains run one-row
tasks alone)."""


async def enqueue_step(side: Side) -> None:
    async with side.sessions() as db, db.begin():
        await side.app.tasks.get("noop").enqueue(db, n=next(side.keys), run_at=LATER)


async def timed(side: Side, step: Step, seconds: float, most: int) -> float:
    """Steps per second, for `seconds` or `most` steps, whichever ends first."""
    done = 0
    started = time.perf_counter()
    deadline = started + seconds
    while done < most:
        await step(side)
        done += 1
        if time.perf_counter() >= deadline:
            break
    return done / (time.perf_counter() - started)


async def drained(side: Side) -> int:
    return int(await side.raw.fetchval("SELECT count(*) FROM bench_effects"))


async def drain_rate(side: Side, tasks: int, concurrency: int) -> float:
    """Enqueue `tasks` one-row tasks, then time one worker from its start to the last row."""
    await side.raw.execute("TRUNCATE bench_effects")
    one_row = side.app.tasks.get("one_row")
    for start in range(0, tasks, 1000):
        async with side.sessions() as db, db.begin():
            await one_row.enqueue_many(
                db, [{"n": n} for n in range(start, min(tasks, start + 1000))]
            )
    stopping = asyncio.Event()
    started = time.perf_counter()
    worker = asyncio.create_task(consume(side.app, stopping, concurrency=concurrency, poll=0.05))
    deadline = started + 600
    while await drained(side) < tasks:
        if worker.done():
            worker.result()
            raise RuntimeError("the worker stopped on its own")
        if time.perf_counter() > deadline:
            raise TimeoutError("the drain did not finish in 600 s")
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - started
    stopping.set()
    await worker
    return tasks / elapsed


async def listing_ms(read: Callable[[], Awaitable[Any]], times: int) -> tuple[float, float]:
    """The median and the slowest of `times` reads, in ms (after one warm-up read)."""
    await read()
    took = []
    for _ in range(times):
        started = time.perf_counter()
        await read()
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took), max(took)


def listings(side: Side) -> dict[str, Callable[[], Awaitable[Any]]]:
    app = side.app
    return {
        f"`oncely history {HISTORY_JOB} --limit 50`": lambda: app.history(HISTORY_JOB, 50),
        "`oncely tasks --state dead --limit 50`": lambda: list_tasks(app, TaskState.DEAD, None, 50),
        "`oncely tasks --state succeeded --limit 50`": lambda: list_tasks(
            app, TaskState.SUCCEEDED, None, 50
        ),
        "`oncely list`'s last runs (`app.last_runs`)": app.last_runs,
        "a starting worker's newest slots (`store.claims.last_slots`)": app.store.claims.last_slots,
    }


# -- prune while a worker drains ----------------------------------------------------------


@dataclass
class PruneResult:
    seconds: float
    tasks: int
    claims: int
    longest_xact_ms: float
    drained: int
    rate: float
    longest_gap_ms: float
    p99_gap_ms: float


async def longest_prune_xact(admin: Any, database: str, stop: asyncio.Event) -> float:
    """The longest age (ms) of a transaction running a DELETE on oncely's tables, sampled."""
    longest = 0.0
    query = (
        "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0) "
        "FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() "
        "AND state <> 'idle' AND query ILIKE '%DELETE FROM oncely_%'"
    )
    while not stop.is_set():
        longest = max(longest, float(await admin.fetchval(query, database)) * 1000)
        await asyncio.sleep(0.01)
    return longest


async def produce(side: Side, stop: asyncio.Event, backlog: int) -> None:
    """Keep about `backlog` one-row tasks waiting for the worker until `stop` is set."""
    one_row = side.app.tasks.get("one_row")
    sent = 0
    while not stop.is_set():
        if sent - len(side.done) < backlog:
            async with side.sessions() as db, db.begin():
                await one_row.enqueue_many(db, [{"n": n} for n in range(sent, sent + 100)])
            sent += 100
        else:
            await asyncio.sleep(0.005)


async def prune_while_draining(side: Side, admin: Any, concurrency: int) -> PruneResult:
    side.done.clear()
    stop_producer, stop_worker, stop_sampler = asyncio.Event(), asyncio.Event(), asyncio.Event()
    producer = asyncio.create_task(produce(side, stop_producer, 300))
    worker = asyncio.create_task(consume(side.app, stop_worker, concurrency=concurrency, poll=0.05))
    deadline = time.perf_counter() + 60
    while len(side.done) < 200:  # the worker is in its stride
        if worker.done():
            worker.result()
        if worker.done() or time.perf_counter() > deadline:
            raise RuntimeError("the worker did not start draining")
        await asyncio.sleep(0.01)
    database = make_url(side.url).database
    sampler = asyncio.create_task(longest_prune_xact(admin, str(database), stop_sampler))
    before = len(side.done)
    started = time.perf_counter()
    pruned_tasks, pruned_claims = await prune(side.app, PRUNE_AGE)
    ended = time.perf_counter()
    during = [t for t in side.done[before:] if t <= ended]
    stop_sampler.set()
    longest_xact = await sampler
    stop_producer.set()
    await producer
    stop_worker.set()
    await worker
    marks = [started, *during, ended]
    gaps = sorted(b - a for a, b in itertools.pairwise(marks))
    gap, gap_p99 = gaps[-1], gaps[int(len(gaps) * 0.99)]
    return PruneResult(
        seconds=ended - started,
        tasks=pruned_tasks,
        claims=pruned_claims,
        longest_xact_ms=longest_xact,
        drained=len(during),
        rate=len(during) / (ended - started),
        longest_gap_ms=gap * 1000,
        p99_gap_ms=gap_p99 * 1000,
    )


# -- running and reporting ----------------------------------------------------------------


async def bench(args: argparse.Namespace) -> None:
    admin = await asyncpg.connect(
        make_url(args.postgres_url).set(drivername="postgresql").render_as_string(False)
    )
    sides: list[Side] = []
    try:
        for name in ("empty", "full"):
            sides.append(await create_side(admin, args.postgres_url, name, not args.no_fsync))
        full = sides[1]
        print("databases: " + ", ".join(str(make_url(s.url).database) for s in sides), flush=True)
        print(
            f"filling: {args.claims:,} claims, {args.finished:,} finished and "
            f"{args.queued:,} queued tasks",
            flush=True,
        )
        took = await fill(full, args.claims, args.finished, args.queued)
        print("  " + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()), flush=True)
        size = await full.raw.fetchval(
            "SELECT pg_size_pretty(pg_database_size(current_database()))"
        )
        print(f"  the filled database: {size}", flush=True)
        await report_rates(sides, args)
        await report_listings(sides, args)
        await report_prune(sides, admin, args)
    finally:
        for side in sides:
            await side.raw.close()
            await side.app.aclose()
            await side.engine.dispose()
            database = make_url(side.url).database
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()


async def report_rates(sides: list[Side], args: argparse.Namespace) -> None:
    steps: list[tuple[str, Step]] = [
        ("claim_run on AsyncSession /s", claim_step),
        ("app.run no-op /s", run_step),
        ("enqueue on AsyncSession /s", enqueue_step),
    ]
    rates = [Rate(name) for name, _ in steps] + [Rate(f"one-row drain c={args.concurrency} /s")]
    for side in sides:  # warm-up: connections, prepared statements, caches
        for _, step in steps:
            for _ in range(20):
                await step(side)
    for round_no in range(args.rounds):
        order = sides if round_no % 2 == 0 else sides[::-1]  # neither side always goes first
        for (_, step), rate in zip(steps, rates, strict=False):
            for side in order:
                value = await timed(side, step, args.seconds, args.most)
                getattr(rate, side.name).append(value)
    for round_no in range(args.drain_rounds):
        print(f"drain round {round_no + 1}/{args.drain_rounds}", flush=True)
        for side in sides if round_no % 2 == 0 else sides[::-1]:
            value = await drain_rate(side, args.drain, args.concurrency)
            getattr(rates[-1], side.name).append(value)
    print(
        f"\nrates, median of {args.rounds} rounds of {args.seconds} s "
        f"({args.drain_rounds} of {args.drain} tasks for the drain), the sides alternating; "
        "full / empty: the median of the rounds' ratios, and their range"
    )
    print("| measurement | empty tables | full tables | full / empty | range |")
    print("|---|---:|---:|---:|---:|")
    for rate in rates:
        mid, low, high = rate.ratio()
        print(
            f"| {rate.name} | {statistics.median(rate.empty):,.0f} | "
            f"{statistics.median(rate.full):,.0f} | {mid:.2f} | {low:.2f}-{high:.2f} |"
        )


async def report_listings(sides: list[Side], args: argparse.Namespace) -> None:
    found: dict[str, dict[str, tuple[float, float]]] = {}
    for side in sides:
        for name, read in listings(side).items():
            found.setdefault(name, {})[side.name] = await listing_ms(read, args.reads)
    print(f"\nlistings, ms (median / slowest of {args.reads} reads)")
    print("| listing | empty tables | full tables |")
    print("|---|---:|---:|")
    for name, by_side in found.items():
        cells = [f"{by_side[s][0]:.1f} / {by_side[s][1]:.1f}" for s in ("empty", "full")]
        print(f"| {name} | " + " | ".join(cells) + " |")


async def report_prune(sides: list[Side], admin: Any, args: argparse.Namespace) -> None:
    results = {
        side.name: await prune_while_draining(side, admin, args.concurrency) for side in sides
    }
    print(f"\nprune --older-than {PRUNE_AGE.days}d while a worker drains one-row tasks")
    print("| | empty tables | full tables |")
    print("|---|---:|---:|")
    rows: list[tuple[str, Callable[[PruneResult], str]]] = [
        ("prune time, s", lambda r: f"{r.seconds:.2f}"),
        ("finished tasks deleted", lambda r: f"{r.tasks:,}"),
        ("claims deleted", lambda r: f"{r.claims:,}"),
        ("its longest transaction, ms", lambda r: f"{r.longest_xact_ms:.0f}"),
        ("tasks drained meanwhile", lambda r: f"{r.drained:,}"),
        ("drain rate meanwhile, /s", lambda r: f"{r.rate:,.0f}"),
        (
            "gap between two tasks, p99 / longest, ms",
            lambda r: f"{r.p99_gap_ms:.0f} / {r.longest_gap_ms:.0f}",
        ),
    ]
    for name, cell in rows:
        print(f"| {name} | {cell(results['empty'])} | {cell(results['full'])} |")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres-url", default=PG_URL, help="server to create databases on")
    parser.add_argument("--claims", type=int, default=1_000_000)
    parser.add_argument("--finished", type=int, default=5_000_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=24, help="rounds per rate (median shown)")
    parser.add_argument("--seconds", type=float, default=0.3, help="length of a rate's round")
    parser.add_argument("--drain-rounds", type=int, default=4, help="drains per side")
    parser.add_argument("--most", type=int, default=1_000_000, help="at most N steps a round")
    parser.add_argument("--drain", type=int, default=3000, help="tasks per drain round")
    parser.add_argument("--concurrency", type=int, default=2, help="the worker's lanes")
    parser.add_argument("--reads", type=int, default=20, help="timed reads per listing")
    parser.add_argument("--no-fsync", action="store_true", help="synchronous_commit = off")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes and rounds: a smoke run of seconds"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.claims, args.finished, args.queued = 2_000, 10_000, 200
        args.rounds, args.seconds, args.most, args.drain, args.reads = 1, 0.2, 50, 50, 3
        args.drain_rounds = 1
    if min(args.claims, args.finished, args.queued) < 0:
        parser.error("--claims, --finished and --queued must be >= 0")
    counts = (args.rounds, args.drain_rounds, args.most, args.drain, args.reads)
    if min(counts) < 1 or args.seconds <= 0:
        parser.error(
            "--rounds, --drain-rounds, --most, --drain and --reads must be >= 1, --seconds > 0"
        )
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    print(
        f"python {platform.python_version()}, sqlalchemy {sa.__version__}, "
        f"asyncpg {asyncpg.__version__}, {os.cpu_count()} cpus, {platform.machine()}",
        flush=True,
    )
    await bench(args)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
