"""An app whose job holds its slot until the test says so: for shutdown tests.

`hold` (every second, overlap skip, catch-up none) inserts a row, creates
$ONCELY_TEST_SIGNALS/started-<pid>, then waits (without blocking the event loop) for the
file `release` before returning.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import sqlalchemy as sa

from oncely import Oncely, every

app = Oncely()
SIGNAL_DIR = Path(os.environ.get("ONCELY_TEST_SIGNALS", "."))

APP_TABLES = "CREATE TABLE IF NOT EXISTS held (slot varchar(64) NOT NULL)"


@app.job(every(seconds=1), catch_up="none")
async def hold(db, now):  # type: ignore[no-untyped-def]
    await db.execute(sa.text("INSERT INTO held (slot) VALUES (:s)"), {"s": now.isoformat()})
    await db.flush()
    (SIGNAL_DIR / f"started-{os.getpid()}").touch()
    for _ in range(12000):
        if (SIGNAL_DIR / "release").exists():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("never released")
