"""One app with a scheduled job and tasks, for `oncely worker` running both."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import sqlalchemy as sa

from oncely import Oncely, every

app = Oncely()

SIGNAL_DIR = Path(os.environ.get("ONCELY_TEST_SIGNALS", "."))
TABLES = (
    "CREATE TABLE ticks (slot varchar(40) NOT NULL)",
    "CREATE TABLE effects (n integer NOT NULL)",
)


@app.job(every(seconds=1), catch_up="none")
async def tick(db, now):  # type: ignore[no-untyped-def]
    await db.execute(sa.text("INSERT INTO ticks (slot) VALUES (:s)"), {"s": now.isoformat()})


@app.task
async def record(db, n: int) -> None:  # type: ignore[no-untyped-def]
    await db.execute(sa.text("INSERT INTO effects (n) VALUES (:n)"), {"n": n})


@app.task
async def hang(db, n: int) -> None:  # type: ignore[no-untyped-def]
    """Writes its effect, says so with a file, then waits (until cancelled)."""
    await db.execute(sa.text("INSERT INTO effects (n) VALUES (:n)"), {"n": n})
    await db.flush()
    (SIGNAL_DIR / f"hanging-{n}").touch()
    await asyncio.Event().wait()
