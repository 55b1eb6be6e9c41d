"""What one round trip costs a Python client: `SELECT 1` in a loop on one asyncpg connection.

    python bench/round_trip.py [--database-url URL] [--count 5000] [--loop asyncio|uvloop]

Prints the wall time and this process's CPU time (user and system) per round trip: the floor
under every statement a worker sends (docs/scale.md). uvloop, if chosen, must be installed.
Never a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time

import asyncpg


async def measure(url: str, count: int) -> str:
    conn = await asyncpg.connect(url)
    try:
        for _ in range(200):  # warm up
            await conn.fetchval("SELECT 1")
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(count):
            await conn.fetchval("SELECT 1")
        wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    finally:
        await conn.close()
    user = (after.ru_utime - before.ru_utime) / count * 1e6
    system = (after.ru_stime - before.ru_stime) / count * 1e6
    return (
        f"{count} round trips: wall {wall / count * 1e6:.0f} µs, CPU {user + system:.0f} µs"
        f" (user {user:.0f}, system {system:.0f}) each"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    if args.count < 1:
        parser.error("--count must be at least 1")
    if args.loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            parser.error("--loop uvloop: uvloop is not installed (pip install uvloop)")
        print(args.loop, uvloop.run(measure(args.database_url, args.count)))
    else:
        print(args.loop, asyncio.run(measure(args.database_url, args.count)))


if __name__ == "__main__":
    main()
