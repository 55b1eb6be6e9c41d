"""An app for the dashboard's browser tests and its screenshots. Each job writes one row per
call into `effects` (job, slot), so a test counts effects, not pixels.

- `beat`: every second (the pause test: a worker runs it, the page pauses it);
- `nightly`: every hour (the backfill test: a plan of a range, then apply);
- `scripted`: every second, 10 s timeout; what a slot does is read from the `script` table
  (slot ISO -> `fail` raises, `slow` outlives the timeout, `hold` waits for the file
  $ONCELY_TEST_HOLD), else it writes its effect: a test writes the history it then counts;
- `report`: every hour, the same script as `scripted` (the docs' screenshots: a day of it);
- `yearly`: once a year, for a worker that should run tasks and (almost) no slots;
- tasks `send_receipt` (queue `mail`: a negative order raises, one attempt: dead at once),
  `resize_image` (queue `media`) and `sync_crm` (queue `default`).
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from oncely import Oncely, RetryPolicy, cron, every

app = Oncely()

TABLES = [
    "CREATE TABLE IF NOT EXISTS effects (job varchar(64) NOT NULL, slot varchar(64) NOT NULL)",
    "CREATE TABLE IF NOT EXISTS script (slot varchar(64) PRIMARY KEY, behaviour varchar(16))",
]
_INSERT = sa.text("INSERT INTO effects (job, slot) VALUES (:j, :s)")
_BEHAVIOUR = sa.text("SELECT behaviour FROM script WHERE slot = :s")


class UpstreamError(RuntimeError):
    """What a scripted failure raises."""


def _ticker(name: str):  # type: ignore[no-untyped-def]
    async def job(db, now):  # type: ignore[no-untyped-def]
        await db.execute(_INSERT, {"j": name, "s": now.isoformat()})

    return job


app.job(every(seconds=1), name="beat")(_ticker("beat"))
app.job(every(hours=1), name="nightly")(_ticker("nightly"))
app.job(cron("0 0 1 1 *"), name="yearly")(_ticker("yearly"))


async def _wait_for_release() -> None:
    release = Path(os.environ["ONCELY_TEST_HOLD"])
    Path(f"{release}.started").touch()
    deadline = time.monotonic() + 120
    while not release.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def _scripted(name: str):  # type: ignore[no-untyped-def]
    async def job(db, now: datetime):  # type: ignore[no-untyped-def]
        behaviour = (await db.execute(_BEHAVIOUR, {"s": now.isoformat()})).scalar()
        if behaviour == "fail":
            raise UpstreamError("the upstream answered 503")
        if behaviour == "slow":
            await asyncio.sleep(60)
        if behaviour == "hold":
            await _wait_for_release()
        await db.execute(_INSERT, {"j": name, "s": now.isoformat()})

    return job


app.job(every(seconds=1), name="scripted", timeout=timedelta(seconds=10))(_scripted("scripted"))
app.job(every(hours=1), name="report", timeout=timedelta(seconds=2))(_scripted("report"))


@app.task(queue="mail", retry=RetryPolicy(attempts=1))
async def send_receipt(db, order: int) -> str:  # type: ignore[no-untyped-def]
    if order < 0:
        raise UpstreamError(f"the mail gateway refused order {order}")
    return f"sent {order}"


@app.task(queue="media")
async def resize_image(db, path: str) -> None:  # type: ignore[no-untyped-def]
    return None


@app.task
async def sync_crm(db, account: int) -> None:  # type: ignore[no-untyped-def]
    return None
