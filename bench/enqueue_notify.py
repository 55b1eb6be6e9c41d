"""Enqueue throughput of concurrent enqueuers with enqueue notifications on and off.

Every enqueueing commit that sent a NOTIFY takes Postgres's instance-wide notification lock
and holds it through its commit record's flush, so commits that notify are serialized. With
the server setting `oncely.notify = off` the trigger sends nothing and the commit takes no such
lock (the workers poll). Here `--enqueuers` connections (asyncpg, oncely's enqueue on the bare
connection) each enqueue in a loop, one task per transaction (`single`) or `--batch` tasks per
transaction (`batch`), for `--seconds`, with the setting on and off side by side in each round
(the order alternates round by round); one line per round, then the ratio off / on of each.

    PYTHONPATH=src python bench/enqueue_notify.py --rounds 3
    PYTHONPATH=src python bench/enqueue_notify.py --seconds 0.3 --rounds 1    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from oncely import Oncely  # noqa: E402

PG_URL = os.environ.get(
    "ONCELY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
SHAPES = ("single", "batch")
SETTINGS = ("on", "off")


async def enqueue_for(
    url: str, task: Any, notify: str, batch: int, seconds: float, enqueuers: int
) -> float:
    """Tasks per second that `enqueuers` connections enqueue in `seconds`."""
    conns = [
        await asyncpg.connect(url, server_settings={"oncely.notify": notify})
        for _ in range(enqueuers)
    ]
    start = asyncio.Event()
    counts = [0] * enqueuers

    async def loop(i: int, conn: asyncpg.Connection) -> None:
        await start.wait()
        deadline = time.perf_counter() + seconds
        n = 0
        while time.perf_counter() < deadline:
            async with conn.transaction():
                if batch == 1:
                    await task.enqueue(conn, n=n)
                else:
                    await task.enqueue_many(conn, [{"n": n + k} for k in range(batch)])
            n += batch
        counts[i] = n

    try:
        runs = [asyncio.create_task(loop(i, c)) for i, c in enumerate(conns)]
        wall0 = time.perf_counter()
        start.set()
        await asyncio.gather(*runs)
        return sum(counts) / (time.perf_counter() - wall0)
    finally:
        for conn in conns:
            await conn.close()


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres-url", default=PG_URL)
    parser.add_argument("--enqueuers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=100, help="tasks per batch transaction")
    parser.add_argument("--seconds", type=float, default=5.0, help="per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.enqueuers < 1 or args.batch < 2 or args.seconds <= 0 or args.rounds < 1:
        parser.error("--enqueuers >= 1, --batch >= 2, --seconds > 0 and --rounds >= 1")
    base = make_url(args.postgres_url).set(drivername="postgresql")
    admin = await asyncpg.connect(base.render_as_string(False))
    name = f"oncely_enqueue_notify_{os.getpid()}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = base.set(database=name).render_as_string(False)
    app = Oncely(url)
    try:
        await app.migrate()

        @app.task
        async def noop(db: Any, n: int) -> None:
            return None

        rates: dict[tuple[str, str], list[float]] = {}
        print(f"{args.enqueuers} enqueuers, {args.seconds:g} s per case, tasks/s")
        print("| round | shape | notify on | notify off | off / on |")
        print("|---|---|---:|---:|---:|")
        for r in range(args.rounds):
            order = SETTINGS if r % 2 == 0 else SETTINGS[::-1]
            for shape in SHAPES:
                batch = 1 if shape == "single" else args.batch
                got = {}
                for notify in order:
                    got[notify] = await enqueue_for(
                        url, noop, notify, batch, args.seconds, args.enqueuers
                    )
                    rates.setdefault((shape, notify), []).append(got[notify])
                    async with app.store.engine.begin() as conn:  # same table size for each
                        await conn.execute(sa.text("TRUNCATE oncely_tasks"))
                ratio = got["off"] / got["on"]
                on, off = got["on"], got["off"]
                print(f"| {r + 1} | {shape} | {on:,.0f} | {off:,.0f} | {ratio:.2f}x |")
        print("\nmedian of the rounds")
        for shape in SHAPES:
            on = statistics.median(rates[(shape, "on")])
            off = statistics.median(rates[(shape, "off")])
            print(f"| {shape} | {on:,.0f} | {off:,.0f} | {off / on:.2f}x |")
    finally:
        await app.aclose()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
