"""An app for the CLI's adoption tests: a job that holds its slot until told, a job every
second, and tasks to list (one fails its first attempt, then succeeds).

`close` (Friday 18:00, Mexico City) inserts a row, creates $ONCELY_TEST_SIGNALS/started-<pid>,
then waits for the file `release` (returns: commits) or `fail` (raises: rolls back).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import sqlalchemy as sa

from oncely import Oncely, RetryPolicy, cron, every

app = Oncely()
SIGNAL_DIR = Path(os.environ.get("ONCELY_TEST_SIGNALS", "."))
APP_TABLES = ("CREATE TABLE IF NOT EXISTS closes (slot varchar(64) NOT NULL)",)


def create_tables(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        for statement in APP_TABLES:
            conn.exec_driver_sql(statement)


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
async def close(db, now):  # type: ignore[no-untyped-def]
    await db.execute(sa.text("INSERT INTO closes (slot) VALUES (:s)"), {"s": now.isoformat()})
    await db.flush()
    (SIGNAL_DIR / f"started-{os.getpid()}").touch()
    for _ in range(6000):
        if (SIGNAL_DIR / "release").exists():
            return
        if (SIGNAL_DIR / "fail").exists():
            raise RuntimeError("the close failed after writing")
        await asyncio.sleep(0.01)
    raise TimeoutError("never released")


@app.job(every(seconds=1), catch_up="none")
async def tick(db, now):  # type: ignore[no-untyped-def]
    """Does nothing: two workers race for each of its slots."""


class Flaky(Exception):
    """A failure worth retrying."""


@app.task(retry=RetryPolicy(attempts=3, wait=0.05, backoff="fixed", jitter=0), queue="mail")
async def send_once_flaky(db, n: int) -> None:  # type: ignore[no-untyped-def]
    """Fails its first attempt (a file says it did), succeeds on the retry."""
    mark = SIGNAL_DIR / f"failed-{n}"
    if not mark.exists():
        mark.touch()
        raise Flaky(f"smtp timeout on {n}")


@app.task
async def noop(db) -> None:  # type: ignore[no-untyped-def]
    """Counted in `oncely list`, never run."""
