"""An app for the control-plane tests: each job writes one row per call into `effects`
(job, slot, replica), so a test counts effects, not log lines.

- `tick`: every second, catch_up="all" (a paused slot that came back would be caught up);
- `hourly`: every hour, for backfills; `weekly`: Fridays 18:00 in Mexico City; `flaky`:
  raises (the default retry policy);
- `boom`: raises (given up at its first failure: `RetryPolicy(attempts=1)`); `slow`: writes,
  then sleeps past its 0.5 s timeout (both given up at their first timeout); `slow_sync`: the same
  as a plain `def` (it cannot be interrupted, and must not commit);
- `hold`: writes, creates "<$ONCELY_TEST_HOLD>.started", then waits for the file
  $ONCELY_TEST_HOLD (a test acts while it runs: cancel, SIGKILL, explain);
- `overlapper`: every second, runs 2.5 s (overlap="skip" skips the slots in between);
- `lagging`: every second, catch_up="latest" (older missed slots are dropped);
- `graceless`: every second with a 1 µs grace: each slot is too late when the worker
  reaches it (dropped by grace);
- `chore`: a task that waits for $ONCELY_TEST_HOLD like `hold`.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from oncely import Oncely, RetryPolicy, cron, every
from oncely.identity import replica_id

app = Oncely()

TABLES = """
CREATE TABLE IF NOT EXISTS effects (job varchar(64) NOT NULL, slot varchar(64) NOT NULL,
                                    replica varchar(255) NOT NULL)
"""
_INSERT = sa.text("INSERT INTO effects (job, slot, replica) VALUES (:j, :s, :r)")


def _effect(name: str, slot: datetime) -> dict[str, str]:
    return {"j": name, "s": slot.isoformat(), "r": replica_id()}


def _ticker(name: str, seconds: float = 0.0):  # type: ignore[no-untyped-def]
    async def job(db, now):  # type: ignore[no-untyped-def]
        await db.execute(_INSERT, _effect(name, now))
        if seconds:
            await asyncio.sleep(seconds)

    return job


app.job(every(seconds=1), name="tick", catch_up="all", grace=timedelta(minutes=5))(_ticker("tick"))
app.job(every(hours=1), name="hourly")(_ticker("hourly"))
app.job(every(seconds=1), name="overlapper")(_ticker("overlapper", 2.5))
app.job(every(seconds=1), name="lagging")(_ticker("lagging"))
app.job(every(seconds=1), name="graceless", grace=timedelta(microseconds=1))(_ticker("graceless"))
ONCE = RetryPolicy(attempts=1)  # given up at the first failure or timeout
app.job(every(hours=1), name="slow", timeout=timedelta(seconds=0.5), retry=ONCE)(
    _ticker("slow", 10)
)


@app.job(every(hours=1), timeout=timedelta(seconds=0.3), retry=ONCE)
def slow_sync(db, now):  # type: ignore[no-untyped-def]
    db.execute(_INSERT, _effect("slow_sync", now))
    time.sleep(1.0)


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
async def weekly(db, now):  # type: ignore[no-untyped-def]
    await db.execute(_INSERT, _effect("weekly", now))


@app.job(every(hours=1))  # the default retry policy: 5 attempts from 3 s
async def flaky(db, now):  # type: ignore[no-untyped-def]
    await db.execute(_INSERT, _effect("flaky", now))
    raise ConnectionError("the upstream is down")


@app.job(every(hours=1), retry=RetryPolicy(attempts=1))  # given up at its first failure
async def boom(db, now):  # type: ignore[no-untyped-def]
    await db.execute(_INSERT, _effect("boom", now))
    raise RuntimeError("the upstream answered 503")


async def _wait_for_release() -> None:
    release = Path(os.environ["ONCELY_TEST_HOLD"])
    Path(f"{release}.started").touch()
    deadline = time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


@app.job(every(hours=1))
async def hold(db, now):  # type: ignore[no-untyped-def]
    await db.execute(_INSERT, _effect("hold", now))
    await _wait_for_release()


@app.task
async def chore(db, n: int):  # type: ignore[no-untyped-def]
    await _wait_for_release()
