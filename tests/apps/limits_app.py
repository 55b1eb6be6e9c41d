"""Tasks with limits for tests that run workers in real processes.

Each task records its interval (key, start, end) in `intervals`, read from the database's
clock, in the task's own transaction: an attempt that rolled back (its worker was killed)
leaves no interval, so the table holds exactly the attempts that took effect.
"""

from __future__ import annotations

import asyncio
import os

import sqlalchemy as sa

from oncely import Oncely

app = Oncely()

INTERVALS_DDL = (
    "CREATE TABLE IF NOT EXISTS intervals (n integer NOT NULL, k varchar(40) NOT NULL, "
    "s double precision NOT NULL, e double precision NOT NULL, pid integer NOT NULL)"
)
_INSERT = sa.text("INSERT INTO intervals (n, k, s, e, pid) VALUES (:n, :k, :s, :e, :pid)")
HOLD = float(os.environ.get("ONCELY_TEST_HOLD", "0.01"))
"""Seconds each task holds its slot (long enough for a broken limit to show an overlap)."""


async def db_now(db) -> float:  # type: ignore[no-untyped-def]
    """The database's clock, in seconds since the epoch (SQLite: this machine's, to 1 ms)."""
    if db.bind.dialect.name == "postgresql":
        query = "SELECT CAST(extract(epoch FROM clock_timestamp()) AS double precision)"
    else:
        query = "SELECT (julianday('now') - 2440587.5) * 86400.0"
    return float((await db.execute(sa.text(query))).scalar_one())


async def _hold(db, n: int, key: str) -> None:  # type: ignore[no-untyped-def]
    start = await db_now(db)
    await asyncio.sleep(HOLD)
    end = await db_now(db)
    await db.execute(_INSERT, {"n": n, "k": key, "s": start, "e": end, "pid": os.getpid()})


@app.task(concurrency=1, concurrency_key=lambda n, key: key)
async def keyed(db, n: int, key: str) -> None:  # type: ignore[no-untyped-def]
    """At most one at a time per key."""
    await _hold(db, n, key)


@app.task(concurrency=3)
async def three(db, n: int) -> None:  # type: ignore[no-untyped-def]
    """At most three at a time, whatever the arguments."""
    await _hold(db, n, "all")


@app.task(rate="50/s")
async def paced(db, n: int) -> None:  # type: ignore[no-untyped-def]
    """At most 50 starts in any second."""
    await _hold(db, n, "paced")


@app.task
async def total(db, a: int, b: int) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Returns a result: what `oncely tasks show` prints."""
    return {"sum": a + b}
