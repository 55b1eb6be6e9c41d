"""A small app for the reliability tests: jobs and a task that need no tables of their own.

`minutely` and `nightly` write nothing but their claims; `hold` waits until the file named
by $ONCELY_TEST_HOLD exists (it signals that it started by creating "<that file>.started"),
so a test can act while a slot is running in another process; `note` is a task.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from oncely import Oncely, cron, every

app = Oncely()


@app.job(every(minutes=1))
async def minutely(db, now):  # type: ignore[no-untyped-def]
    return None


@app.job(cron("0 3 * * *", tz="UTC"))
async def nightly(db, now):  # type: ignore[no-untyped-def]
    return None


@app.job(every(minutes=1))
async def hold(db, now):  # type: ignore[no-untyped-def]
    release = Path(os.environ["ONCELY_TEST_HOLD"])
    Path(f"{release}.started").touch()
    while not release.exists():
        await asyncio.sleep(0.02)


@app.task
async def note(db, n: int = 0) -> None:  # type: ignore[no-untyped-def]
    return None


@app.job(every(minutes=1), key=lambda now: "slot-\ud800")  # a lone surrogate: not storable
async def surrogate_key(db, now):  # type: ignore[no-untyped-def]
    return None
