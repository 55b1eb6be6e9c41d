"""Claims per second: oncely's claim and `app.run` against raw driver loops, in one run.

Every case claims fresh keys in a loop on one connection, one claim per transaction, into
the same `oncely_runs` table (same indexes, same growth). The raw baselines are the floor a
driver allows; the SQLAlchemy floors are the same statement through SQLAlchemy with no
oncely code, so the difference between a floor and an oncely case is oncely's own cost.

Postgres cases:
  raw asyncpg            BEGIN; INSERT … ON CONFLICT DO NOTHING RETURNING 1; COMMIT
  claim_run on asyncpg   BEGIN; oncely.claim_run(conn, job, key); COMMIT (bare asyncpg conn)
  raw asyncpg, run SQL   what app.run sends: BEGIN; lock-and-claim CTE (pause read inside);
                         fate check + SAVEPOINT; UPDATE finished_at + COMMIT
  SA Core connection     engine.begin() + conn.execute(text(INSERT …))   (no ORM, no oncely)
  SA AsyncSession        session.begin() + session.execute(text(INSERT …)) (no oncely)
  oncely.claim_run       session.begin() + oncely.claim_run(session, job, key)
  SA, app.run's SQL      app.run's statements via AsyncSession on oncely's engine (no oncely)
  oncely app.run         app.run of a no-op job, every(seconds=1), `now` +1 s each time
  claim_run, app engine  claim_run on an AsyncSession of the app's own engine
  oncely app.effect      `async with app.effect(key)` of a no-op body (vs claim_run above)
  oncely app.once        an `app.once` handler of a no-op body (vs claim_run above)
SQLite: the same, with stdlib sqlite3 (WAL) and raw aiosqlite as the driver floors.

Cases run round-robin for --rounds rounds of --seconds each (or --n claims, whichever comes
first), so a noisy neighbour hurts all cases alike. The table shows each case's median round,
and its ratio to the baseline as the median of the per-round ratios (with their range): the
baseline's own speed wanders by a third between seconds on a shared machine, and a ratio
taken within one round cancels that. Next to claims/s it shows this process's CPU time per
claim, which a busy disk or a busy neighbour disturbs far less than wall time: it is the cost
that is ours.

    python bench/claim.py                       # both databases, about 25 s
    python bench/claim.py --db sqlite --n 50    # a smoke run
    python bench/claim.py --no-fsync            # round trips and CPU only, no disk waits
    python bench/claim.py --only app.run --profile tottime   # where app.run's time goes
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import os
import platform
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

import oncely
import oncely.store.postgres_statements as pg
from oncely import Oncely, every
from oncely.locks import job_lock_key, slot_lock_key

PG_URL = os.environ.get(
    "ONCELY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
WARMUP = 30
REPLICA = "bench:1"

PG_INSERT = (
    "INSERT INTO oncely_runs (job, key, claimed_at, claimed_by) VALUES ($1, $2, now(), $3) "
    "ON CONFLICT DO NOTHING RETURNING 1"
)
SA_INSERT = sa.text(
    "INSERT INTO oncely_runs (job, key, claimed_at, claimed_by) "
    "VALUES (:job, :key, CURRENT_TIMESTAMP, :by) ON CONFLICT DO NOTHING RETURNING 1"
)
SA_RUN_CLAIM = {
    "postgresql": sa.text(
        "WITH lock AS (SELECT pg_try_advisory_xact_lock(:ns, :lock_id) AS got), "
        "ins AS (INSERT INTO oncely_runs (job, key, scheduled_for, claimed_at, claimed_by) "
        "SELECT CAST(:job AS varchar), CAST(:key AS varchar), CAST(:slot AS timestamptz), now(), "
        "CAST(:by AS varchar) FROM lock WHERE lock.got ON CONFLICT DO NOTHING RETURNING 1) "
        "SELECT (SELECT got FROM lock) AS got, (SELECT count(*) FROM ins) AS claimed"
    ),
    "sqlite": sa.text(
        "INSERT INTO oncely_runs (job, key, scheduled_for, claimed_at, claimed_by) "
        "VALUES (:job, :key, :slot, :now, :by) ON CONFLICT DO NOTHING RETURNING 1, 1"
    ),
}
SA_RUN_FINISH = sa.text("UPDATE oncely_runs SET finished_at = :now WHERE job = :job AND key = :key")
LITE_INSERT = (
    "INSERT INTO oncely_runs (job, key, claimed_at, claimed_by) VALUES (?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING RETURNING 1"
)

Step = Callable[[str], Awaitable[Any]]
"""One claim of a fresh key, in its own transaction."""


@dataclass
class Case:
    name: str
    step: Step
    job: str
    versus: str | None = None
    """Another case's name this one is also compared with, round by round."""
    rates: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    claims: int = 0

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def cpu_us(self) -> float:
        """This process's CPU time per claim (µs): our cost, whatever the disk or neighbours do."""
        return statistics.median(self.cpu) * 1e6


_keys = itertools.count()


def fresh_key() -> str:
    return f"k{next(_keys)}"


async def measure(case: Case, seconds: float, n: int) -> None:
    """Run one round of a case: as many claims as fit in `seconds`, at most `n`."""
    done = 0
    cpu = time.process_time()
    started = time.perf_counter()
    deadline = started + seconds
    while done < n:
        await case.step(fresh_key())
        done += 1
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - started
    case.claims += done
    case.rates.append(done / elapsed)
    case.cpu.append((time.process_time() - cpu) / done)


# -- oncely cases, shared by both databases ------------------------------------------------


def noop_app(url: str) -> tuple[Oncely, Step]:
    """An app with one no-op job firing every second; each step runs the next second's slot."""
    app = Oncely(url)

    @app.job(every(seconds=1), name="bench_app_run")
    async def bench_app_run(db: Any, now: datetime) -> None:
        return None

    base = datetime(2020, 1, 1, tzinfo=timezone.utc)
    seconds = itertools.count()

    async def step(_key: str) -> None:
        result = await app.run("bench_app_run", now=base + timedelta(seconds=next(seconds)))
        if result.status is not oncely.RunStatus.RAN:
            raise RuntimeError(f"app.run came back {result.status}, expected ran")

    return app, step


def effect_cases(app: Oncely, prefix: str) -> list[Case]:
    """`app.effect` and `app.once` of a no-op body, and `claim_run` on an AsyncSession of the
    same engine (oncely's own, as an app built from a URL has it): what the two add to it."""
    sessions = async_sessionmaker(app.store.engine, expire_on_commit=False)
    scope = f"{prefix}_bench"
    versus = "oncely.claim_run on the app's engine"

    async def claim(key: str) -> None:
        async with sessions() as s, s.begin():
            if not await oncely.claim_run(s, f"@{scope}_claim", key):
                raise RuntimeError("claim_run lost a fresh key")

    async def effect(key: str) -> None:
        async with app.effect(key, scope=f"{scope}_effect") as db:
            if db is None:
                raise RuntimeError("app.effect skipped a fresh key")

    @app.once(lambda key: key, scope=f"{scope}_once")
    async def handler(db: Any, key: str) -> None:
        return None

    async def once(key: str) -> None:
        if not (await handler(key)).ran:
            raise RuntimeError("app.once skipped a fresh key")

    return [
        Case(versus, claim, f"@{scope}_claim"),
        Case("oncely app.effect, no-op body", effect, f"@{scope}_effect", versus=versus),
        Case("oncely app.once, no-op handler", once, f"@{scope}_once", versus=versus),
    ]


def sqlalchemy_steps(engine: AsyncEngine, prefix: str) -> list[Case]:
    """The SQLAlchemy floors (Core connection, AsyncSession) and oncely.claim_run."""
    sessions = async_sessionmaker(engine, expire_on_commit=False)

    async def core(key: str) -> None:
        async with engine.begin() as conn:
            await conn.execute(SA_INSERT, {"job": f"{prefix}_sa_core", "key": key, "by": REPLICA})

    async def session(key: str) -> None:
        async with sessions() as s, s.begin():
            await s.execute(SA_INSERT, {"job": f"{prefix}_sa_session", "key": key, "by": REPLICA})

    async def claim(key: str) -> None:
        async with sessions() as s, s.begin():
            if not await oncely.claim_run(s, f"{prefix}_claim_run", key):
                raise RuntimeError("claim_run lost a fresh key")

    return [
        Case("SQLAlchemy Core connection (no oncely)", core, f"{prefix}_sa_core"),
        Case("SQLAlchemy AsyncSession (no oncely)", session, f"{prefix}_sa_session"),
        Case("oncely.claim_run on AsyncSession", claim, f"{prefix}_claim_run"),
    ]


def run_sql_floor(app: Oncely, prefix: str) -> Case:
    """app.run's statements through SQLAlchemy on oncely's own engine, with no oncely code."""
    engine = app.store.engine
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    claim = SA_RUN_CLAIM[engine.dialect.name]
    job = f"{prefix}_sa_run_sql"

    async def step(key: str) -> None:
        now = datetime.now(timezone.utc)
        async with sessions() as s, s.begin():
            params = {"ns": 1, "lock_id": hash(key) & 0x7FFFFFFF, "job": job, "key": key}
            row = (await s.execute(claim, {**params, "slot": now, "now": now, "by": REPLICA})).one()
            if not all(row):
                raise RuntimeError("lock-and-claim lost a fresh key")
            await s.execute(SA_RUN_FINISH, {"job": job, "key": key, "now": now})

    return Case("SQLAlchemy, app.run's SQL (no oncely)", step, job)


# -- Postgres -----------------------------------------------------------------------------


async def postgres_cases(
    admin_url: str, durable: bool, stack: list[Callable[[], Awaitable[None]]]
) -> list[Case]:
    parsed = make_url(admin_url)
    name = f"oncely_bench_{os.getpid()}"
    dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await admin.execute(f'CREATE DATABASE "{name}"')
    if not durable:
        await admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')

    async def drop_database() -> None:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()

    stack.append(drop_database)
    url = parsed.set(drivername="postgresql", database=name).render_as_string(False)

    app, app_step = noop_app(url)
    await app.migrate()
    stack.append(app.aclose)

    raw = await asyncpg.connect(url)
    stack.append(raw.close)

    async def raw_claim(key: str) -> None:
        await raw.execute("BEGIN")
        got = await raw.fetchval(PG_INSERT, "pg_raw", key, REPLICA)
        await raw.execute("COMMIT")
        if got != 1:
            raise RuntimeError("raw insert lost a fresh key")

    slot = datetime(2020, 1, 1, tzinfo=timezone.utc)

    async def raw_run_sql(key: str) -> None:
        # app.run's own statements and round trips, sent by hand: BEGIN; lock-and-claim (which
        # names the slot in transaction-local settings); the finish UPDATE with the COMMIT.
        await raw.execute("BEGIN")
        row = await raw.fetchrow(
            pg.DRIVER_LOCK_AND_CLAIM,
            *slot_lock_key("pg_raw_run", key),
            True,
            *job_lock_key("pg_raw_run"),
            "pg_raw_run",
            key,
            slot,
            REPLICA,
            True,  # the pause read, as app.run's
        )
        await raw.execute(pg.DRIVER_CHECK_AND_SAVEPOINT)
        await raw.execute(pg.DRIVER_FINISH_AND_COMMIT)
        if not (row["got"] and row["claimed"]):
            raise RuntimeError("raw lock-and-claim lost a fresh key")

    on_driver = await asyncpg.connect(url)
    stack.append(on_driver.close)

    async def driver_claim(key: str) -> None:
        await on_driver.execute("BEGIN")
        got = await oncely.claim_run(on_driver, "pg_claim_asyncpg", key)
        await on_driver.execute("COMMIT")
        if not got:
            raise RuntimeError("claim_run lost a fresh key")

    user_engine = create_async_engine(make_url(url).set(drivername="postgresql+asyncpg"))
    stack.append(user_engine.dispose)
    return [
        Case("raw asyncpg (baseline)", raw_claim, "pg_raw"),
        Case("oncely.claim_run on an asyncpg connection", driver_claim, "pg_claim_asyncpg"),
        Case("raw asyncpg, app.run's SQL", raw_run_sql, "pg_raw_run"),
        *sqlalchemy_steps(user_engine, "pg"),
        run_sql_floor(app, "pg"),
        Case(
            "oncely app.run, no-op job",
            app_step,
            "bench_app_run",
            versus="raw asyncpg, app.run's SQL",
        ),
        *effect_cases(app, "pg"),
    ]


# -- SQLite -------------------------------------------------------------------------------


async def sqlite_cases(
    directory: Path, durable: bool, stack: list[Callable[[], Awaitable[None]]]
) -> list[Case]:
    import aiosqlite

    path = directory / "bench.db"
    url = f"sqlite:///{path}"
    synchronous = "PRAGMA synchronous = " + ("FULL" if durable else "OFF")
    app, app_step = noop_app(url)
    sa.event.listen(app.store.engine.sync_engine, "connect", lambda c, _r: c.execute(synchronous))
    await app.migrate()  # also turns WAL on, for every connection to this file
    stack.append(app.aclose)

    def now_text() -> str:
        return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(" ")

    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute(synchronous)

    async def close_raw() -> None:
        raw.close()

    stack.append(close_raw)

    async def raw_claim(key: str) -> None:
        raw.execute("BEGIN IMMEDIATE")
        got = raw.execute(LITE_INSERT, ("lite_raw", key, now_text(), REPLICA)).fetchone()
        raw.execute("COMMIT")
        if got is None:
            raise RuntimeError("raw insert lost a fresh key")

    araw = await aiosqlite.connect(path, isolation_level=None)
    await araw.execute(synchronous)
    stack.append(araw.close)

    async def aiosqlite_claim(key: str) -> None:
        await araw.execute("BEGIN IMMEDIATE")
        async with araw.execute(LITE_INSERT, ("lite_aiosqlite", key, now_text(), REPLICA)) as cur:
            got = await cur.fetchone()
        await araw.execute("COMMIT")
        if got is None:
            raise RuntimeError("raw aiosqlite insert lost a fresh key")

    user_engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    sa.event.listen(user_engine.sync_engine, "connect", lambda c, _r: c.execute(synchronous))
    stack.append(user_engine.dispose)
    return [
        Case("raw sqlite3, WAL (baseline)", raw_claim, "lite_raw"),
        Case("raw aiosqlite", aiosqlite_claim, "lite_aiosqlite"),
        *sqlalchemy_steps(user_engine, "lite"),
        run_sql_floor(app, "lite"),
        Case("oncely app.run, no-op job", app_step, "bench_app_run"),
        *effect_cases(app, "lite"),
    ]


# -- running and reporting ----------------------------------------------------------------


async def bench(db: str, args: argparse.Namespace, directory: Path) -> list[Case]:
    stack: list[Callable[[], Awaitable[None]]] = []
    try:
        if db == "postgres":
            cases = await postgres_cases(args.postgres_url, not args.no_fsync, stack)
        else:
            cases = await sqlite_cases(directory, not args.no_fsync, stack)
        if args.only:
            cases = [c for c in cases if c is cases[0] or args.only.lower() in c.name.lower()]
        for case in cases:
            for _ in range(min(WARMUP, args.n)):
                await case.step(fresh_key())
            case.claims = 0
        if args.profile:
            await profile(cases, args)
            return []
        for _ in range(args.rounds):
            for case in cases:
                await measure(case, args.seconds, args.n)
        return cases
    finally:
        for close in reversed(stack):
            await close()


async def profile(cases: list[Case], args: argparse.Namespace) -> None:
    """cProfile each non-baseline case for one round; print where its time goes."""
    for case in cases[1:]:
        profiler = cProfile.Profile()
        profiler.enable()
        await measure(case, args.seconds * args.rounds, args.n)
        profiler.disable()
        print(f"\n## {case.name}: {case.rates[-1]:,.0f} claims/s under cProfile")
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats(args.profile).print_stats(args.profile_lines)


def report(db: str, cases: list[Case]) -> None:
    """One row per case; the ratios are the median of each round's ratio to that round's
    baseline, so a neighbour that slows one round slows both sides of its ratio."""
    base = cases[0]
    print(f"\n{db}: median of {len(base.rates)} rounds")
    print(
        f"| {'case':<44} | {'claims/s':>9} | {'x raw':>5} | {'x raw range':>11} | {'µs/claim':>8} "
        f"| {'CPU µs/claim':>12} | {'CPU x raw':>9} |"
    )
    print(f"|{'-' * 46}|{'-' * 10}:|{'-' * 6}:|{'-' * 12}:|{'-' * 9}:|{'-' * 13}:|{'-' * 10}:|")
    for c in cases:
        ratios = [mine / theirs for mine, theirs in zip(c.rates, base.rates, strict=True)]
        cpu = [theirs / mine for mine, theirs in zip(c.cpu, base.cpu, strict=True)]
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
        print(
            f"| {c.name:<44} | {c.rate:>9,.0f} | {statistics.median(ratios):>5.2f} | {spread:>11} "
            f"| {1e6 / c.rate:>8,.0f} | {c.cpu_us:>12,.0f} | {1 / statistics.median(cpu):>9.2f} |"
        )
    named = {c.name: c for c in cases}
    for c in cases:
        other = named.get(c.versus or "")
        if other is None:
            continue
        ratios = [mine / theirs for mine, theirs in zip(c.rates, other.rates, strict=True)]
        cpu_ratio = statistics.median(c.cpu) / statistics.median(other.cpu)
        print(
            f"{c.name} vs {other.name}: x{statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}), CPU x{cpu_ratio:.2f}"
        )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["postgres", "sqlite", "both"], default="both")
    parser.add_argument("--n", type=int, default=1_000_000, help="at most N claims per round")
    parser.add_argument("--seconds", type=float, default=0.5, help="length of a round per case")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per case (median shown)")
    parser.add_argument("--postgres-url", default=PG_URL, help="server to create a database on")
    parser.add_argument(
        "--no-fsync",
        action="store_true",
        help="commit without waiting for the disk (Postgres synchronous_commit=off, SQLite "
        "synchronous=OFF) so CPU and round trips dominate, not a shared disk",
    )
    parser.add_argument("--only", help="run only cases whose name contains this (and baseline)")
    parser.add_argument(
        "--profile",
        nargs="?",
        const="tottime",
        help="cProfile each case instead of timing it (sort key, default tottime)",
    )
    parser.add_argument("--profile-lines", type=int, default=25)
    args = parser.parse_args(argv)
    if args.n < 1 or args.seconds <= 0 or args.rounds < 1:
        parser.error("--n and --rounds must be >= 1 and --seconds > 0")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    print(
        f"python {platform.python_version()}, sqlalchemy {sa.__version__}, "
        f"asyncpg {asyncpg.__version__}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} cpus, {platform.machine()}",
        flush=True,
    )
    dbs = ["postgres", "sqlite"] if args.db == "both" else [args.db]
    with tempfile.TemporaryDirectory(prefix="oncely-bench-") as tmp:
        for db in dbs:
            cases = await bench(db, args, Path(tmp))
            if cases:
                report(db, cases)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
