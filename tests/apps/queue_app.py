"""A task app for tests that run workers in real processes.

Every task inserts one row in `effects` (its `n`, the worker's pid) in the task's transaction,
so "exactly once" is a count. Some misbehave on purpose: fail transiently at random, hang
until SIGKILLed, or block the worker's event loop long enough to lose their lease.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import sqlalchemy as sa

from oncely import Oncely, RetryPolicy

app = Oncely()

SIGNAL_DIR = Path(os.environ.get("ONCELY_TEST_SIGNALS", "."))
FAIL_RATE = float(os.environ.get("ONCELY_TEST_FAIL_RATE", "0.1"))

EFFECTS_DDL = "CREATE TABLE IF NOT EXISTS effects (n integer NOT NULL, pid integer NOT NULL)"
_INSERT = sa.text("INSERT INTO effects (n, pid) VALUES (:n, :pid)")


class Transient(Exception):
    """A failure worth retrying (a timeout, a 503)."""


@app.task
async def record(db, n: int) -> None:  # type: ignore[no-untyped-def]
    await db.execute(_INSERT, {"n": n, "pid": os.getpid()})


@app.task(retry=RetryPolicy(attempts=100, wait=0.05, backoff="fixed", retry_on=[Transient]))
async def flaky(db, n: int) -> None:  # type: ignore[no-untyped-def]
    """Writes its effect, then fails FAIL_RATE of the time: the write must roll back."""
    await db.execute(_INSERT, {"n": n, "pid": os.getpid()})
    if random.random() < FAIL_RATE:
        raise Transient(f"transient failure on {n}")


@app.task
async def hang(db, n: int) -> None:  # type: ignore[no-untyped-def]
    """Writes, says so with a file, then waits for the test's `release` file."""
    await db.execute(_INSERT, {"n": n, "pid": os.getpid()})
    await db.flush()
    (SIGNAL_DIR / f"started-{n}-{os.getpid()}").touch()
    while not (SIGNAL_DIR / "release").exists():
        await asyncio.sleep(0.01)


@app.task
async def stall(db, n: int, seconds: float) -> None:  # type: ignore[no-untyped-def]
    """Writes, then blocks the worker's event loop (no heartbeats) for `seconds`, once: a
    stalled worker (a long GC pause, a frozen VM)."""
    await db.execute(_INSERT, {"n": n, "pid": os.getpid()})
    await db.flush()
    marker = SIGNAL_DIR / f"stalled-{n}"
    if marker.exists():
        return
    marker.touch()
    (SIGNAL_DIR / f"stalling-{os.getpid()}").touch()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (SIGNAL_DIR / "release").exists():
        time.sleep(0.01)
