"""CPU per enqueue: oncely on an AsyncSession and on asyncpg, SQLAlchemy alone, pgqueuer.

On a shared machine wall-clock rates wander by a factor of two from one second to the next;
the CPU time this process spends per enqueue wanders far less, and it is the part of the cost
that is the client's. Every case runs one enqueue (or one batch of 100) per transaction on a
connection or session it holds, in a database of its own (`synchronous_commit = off`), cases
interleaved round by round; the table shows the median round.

    pip install -r bench/requirements.txt      # pgqueuer
    PYTHONPATH=src python bench/enqueue_cpu.py
    PYTHONPATH=src python bench/enqueue_cpu.py --n 20 --rounds 1     # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from oncely import Oncely  # noqa: E402

PG_URL = os.environ.get(
    "ONCELY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
FLOOR = sa.text(
    "INSERT INTO oncely_tasks (task, queue, args, state, run_at, created_at) "
    "VALUES (:task, 'default', CAST(:args AS jsonb), 'available', now(), now()) RETURNING id"
)
Step = Callable[[int], Awaitable[None]]


async def cases(url: str, stack: list[Callable[[], Awaitable[Any]]]) -> list[tuple[str, Step]]:
    from pgqueuer import AsyncpgDriver, Queries

    app = Oncely(url)
    await app.migrate()
    stack.append(app.aclose)

    @app.task
    async def noop(db: Any, n: int) -> None:
        return None

    pconn = await asyncpg.connect(url)
    stack.append(pconn.close)
    queries = Queries(AsyncpgDriver(pconn))
    await queries.install()
    raw = await asyncpg.connect(url)
    stack.append(raw.close)
    held = AsyncSession(app.store.engine)
    stack.append(held.close)

    async def on_session(n: int) -> None:
        async with held.begin():
            await noop.enqueue(held, n=n)

    async def floor(n: int) -> None:
        async with held.begin():
            await held.execute(FLOOR, {"task": "noop", "args": json.dumps({"n": n})})

    async def on_asyncpg(n: int) -> None:
        async with raw.transaction():
            await noop.enqueue(raw, n=n)

    async def pgqueuer(n: int) -> None:
        async with pconn.transaction():
            await queries.enqueue("noop", json.dumps({"n": n}).encode())

    async def many_on_session(n: int) -> None:
        async with held.begin():
            await noop.enqueue_many(held, [{"n": i} for i in range(100)])

    async def many_on_asyncpg(n: int) -> None:
        async with raw.transaction():
            await noop.enqueue_many(raw, [{"n": i} for i in range(100)])

    async def many_pgqueuer(n: int) -> None:
        payloads = [json.dumps({"n": i}).encode() for i in range(100)]
        await queries.enqueue(["noop"] * 100, payloads, [0] * 100)

    return [
        ("pgqueuer enqueue, own transaction", pgqueuer),
        ("oncely enqueue on an AsyncSession, own transaction", on_session),
        ("SQLAlchemy alone: the INSERT as text on the session", floor),
        ("oncely enqueue on an asyncpg connection, own transaction", on_asyncpg),
        ("pgqueuer enqueue of 100", many_pgqueuer),
        ("oncely enqueue_many of 100 on an AsyncSession", many_on_session),
        ("oncely enqueue_many of 100 on an asyncpg connection", many_on_asyncpg),
    ]


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres-url", default=PG_URL)
    parser.add_argument("--n", type=int, default=1000, help="enqueues per round (batches: n/10)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.n < 10 or args.rounds < 1:
        parser.error("--n must be >= 10 and --rounds >= 1")
    admin = await asyncpg.connect(
        make_url(args.postgres_url).set(drivername="postgresql").render_as_string(False)
    )
    name = f"oncely_enqueue_cpu_{os.getpid()}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    url = make_url(args.postgres_url).set(drivername="postgresql", database=name)
    stack: list[Callable[[], Awaitable[Any]]] = []
    try:
        found = await cases(url.render_as_string(False), stack)
        cpu: dict[str, list[float]] = {label: [] for label, _ in found}
        wall: dict[str, list[float]] = {label: [] for label, _ in found}
        for _ in range(args.rounds):
            for label, step in found:
                n = args.n // 10 if "100" in label else args.n
                for i in range(min(20, n)):
                    await step(i)
                cpu0, wall0 = time.process_time(), time.perf_counter()
                for i in range(n):
                    await step(i)
                cpu[label].append((time.process_time() - cpu0) / n * 1e6)
                wall[label].append((time.perf_counter() - wall0) / n * 1e6)
        print(f"\nmedian of {args.rounds} rounds")
        print("| case | CPU µs each | wall µs each |")
        print("|---|---:|---:|")
        for label, _ in found:
            med_cpu, med_wall = statistics.median(cpu[label]), statistics.median(wall[label])
            print(f"| {label} | {med_cpu:,.0f} | {med_wall:,.0f} |")
    finally:
        for close in reversed(stack):
            await close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
