"""The operator's listings on a filled database: the server's execution time (EXPLAIN
ANALYZE) and the read's time in this process, for this checkout's statements and, with
--before SRC, another checkout's beside them (interleaved read by read).

A database of its own on --postgres-url, filled as bench/table_growth.py fills its full side
(--claims claims of 100 jobs, --finished finished and --queued waiting tasks), then VACUUM
ANALYZE; dropped at the end.

    python bench/listing_plans.py                       # 1,000,000 claims and finished tasks
    git archive bb1f395 | tar -x -C /tmp/before         # the statements before schema 10
    python bench/listing_plans.py --before /tmp/before/src
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
from table_growth import (  # type: ignore[import-not-found]  # noqa: E402
    FILL_CLAIMS,
    FILL_FINISHED,
    FILL_QUEUED,
    JOBS,
    SPAN_S,
)

PG_URL = os.environ.get(
    "ONCELY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def statements(src: Path) -> dict[str, str]:
    """The listings' SQL as the checkout at `src` builds it (its own `oncely` imported)."""
    for name in [m for m in sys.modules if m == "oncely" or m.startswith("oncely.")]:
        del sys.modules[name]
    sys.path.insert(0, str(src))
    try:
        sql = importlib.import_module("oncely.store.sql")
        tasks_sql = importlib.import_module("oncely.store.task_queue_sql")
        built = {
            "`oncely history job_7 --limit 50`": sql.history("job_7", 50),
            "`oncely list`'s last runs": sql.last_claims(),
            "a starting worker's newest slots": sql.last_slots(),
            "`oncely tasks --state succeeded --limit 50`": tasks_sql.listing("succeeded", None, 50),
            "`oncely tasks --state dead --limit 50`": tasks_sql.listing("dead", None, 50),
            "`oncely tasks --limit 50`": tasks_sql.listing(None, None, 50),
        }
    finally:
        sys.path.remove(str(src))
    dialect = postgresql.dialect()
    return {
        k: str(v.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
        for k, v in built.items()
    }


async def fill(url: str, claims: int, finished: int, queued: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("SET synchronous_commit = off")
        per_job = max(1, claims // JOBS)
        await conn.execute(FILL_CLAIMS, JOBS, per_job, SPAN_S / per_job)
        await conn.execute(FILL_FINISHED, finished)
        await conn.execute(FILL_QUEUED, queued)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


def measure(db: sa.Engine, sides: dict[str, dict[str, str]], reads: int) -> dict[str, Any]:
    found: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    with db.connect() as conn:
        for _ in range(reads):
            for side, queries in sides.items():
                for name, query in queries.items():
                    plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, TIMING OFF) " + query).all()
                    server = next(
                        float(line.split(":")[1].split()[0])
                        for (line,) in plan
                        if line.startswith("Execution Time")
                    )
                    started = time.perf_counter()
                    conn.exec_driver_sql(query).all()
                    took = (time.perf_counter() - started) * 1000
                    cell = found.setdefault(name, {}).setdefault(side, ([], []))
                    cell[0].append(server)
                    cell[1].append(took)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres-url", default=PG_URL)
    parser.add_argument("--claims", type=int, default=1_000_000)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--reads", type=int, default=15, help="reads per listing (median)")
    parser.add_argument("--before", type=Path, help="another checkout's src/, measured beside")
    args = parser.parse_args()
    for name in ("claims", "finished", "queued", "reads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.before is not None and not (args.before / "oncely").is_dir():
        parser.error(f"--before {args.before}: no oncely package there")
    sides = {"after": statements(ROOT / "src")}
    if args.before is not None:
        sides = {"before": statements(args.before), **sides}
    name = f"oncely_listings_{os.getpid()}"
    base = make_url(args.postgres_url).set(drivername="postgresql+psycopg2")
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    db = sa.create_engine(base.set(database=name))
    try:
        plain = base.set(drivername="postgresql", database=name).render_as_string(False)
        env = {**os.environ, "ONCELY_DATABASE_URL": plain, "PYTHONPATH": str(ROOT / "src")}
        migrated = subprocess.run(
            [sys.executable, "-m", "oncely", "migrate"], env=env, capture_output=True, text=True
        )
        if migrated.returncode != 0:
            raise SystemExit(migrated.stderr)
        began = time.monotonic()
        plain = base.set(drivername="postgresql", database=name)
        asyncio.run(fill(plain.render_as_string(False), args.claims, args.finished, args.queued))
        print(
            f"{args.claims:,} claims, {args.finished:,} finished and {args.queued:,} waiting"
            f" tasks, filled in {time.monotonic() - began:.0f} s; median of {args.reads} reads,"
            f" load average {os.getloadavg()[0]:.1f}"
        )
        found = measure(db, sides, args.reads)
        heads = " | ".join(f"{side}: server ms / read ms" for side in sides)
        print(f"\n| listing | {heads} |\n|---|" + "---:|" * len(sides))
        for listing, by_side in found.items():
            cells = [
                f"{statistics.median(by_side[s][0]):.2f} / {statistics.median(by_side[s][1]):.1f}"
                for s in sides
            ]
            print(f"| {listing} | " + " | ".join(cells) + " |")
    finally:
        db.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


if __name__ == "__main__":
    main()
