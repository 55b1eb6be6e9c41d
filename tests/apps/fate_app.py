"""Tasks for the tests of a task's fate in a fleet (tests/queue/test_task_fates.py), run by
real worker processes (`queue_worker.py tests.apps.fate_app:app`).

Each task says what it did with a file in $ONCELY_TEST_SIGNALS or a call to the test's
outside service ($ONCELY_TEST_OUTSIDE, host:port), and inserts its effect row
(`effects`: n, pid) in its own transaction.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import sqlalchemy as sa

from oncely import Oncely, RetryPolicy

app = Oncely()

SIGNAL_DIR = Path(os.environ.get("ONCELY_TEST_SIGNALS", "."))
_INSERT = sa.text("INSERT INTO effects (n, pid) VALUES (:n, :pid)")


@app.task(retry=RetryPolicy(attempts=1))
async def napper(db, n: int) -> None:  # type: ignore[no-untyped-def]
    """One attempt only: says it started (a file), waits for the test's `release` file,
    then writes its effect."""
    (SIGNAL_DIR / f"started-{n}-{os.getpid()}").touch()
    while not (SIGNAL_DIR / "release").exists():
        await asyncio.sleep(0.02)
    await db.execute(_INSERT, {"n": n, "pid": os.getpid()})


@app.task
async def eff(db, n: int) -> None:  # type: ignore[no-untyped-def]
    """The first release's `eff` (the next one takes a currency too)."""
    await db.execute(_INSERT, {"n": n, "pid": os.getpid()})


async def call_outside(n: int, seconds: float) -> None:
    """One call to the test's outside service that lasts `seconds` (plain HTTP/1.0)."""
    host, _, port = os.environ["ONCELY_TEST_OUTSIDE"].rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        path = f"/call?n={n}&pid={os.getpid()}&seconds={seconds}"
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        await reader.read()  # the service answers when the call is over, then closes
    finally:
        writer.close()


@app.task(concurrency=1, retry=RetryPolicy(attempts=5, wait=0.1))
async def outside(db, n: int, calls: int, seconds: float) -> None:  # type: ignore[no-untyped-def]
    """At most one at a time in the fleet: makes `calls` outside calls one after another,
    then writes its effect."""
    for _ in range(calls):
        await call_outside(n, seconds)
    await db.execute(_INSERT, {"n": n, "pid": os.getpid()})
