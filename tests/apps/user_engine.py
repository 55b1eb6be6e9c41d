"""An app built on the user's own AsyncEngine, as the FastAPI guide builds it: for running
every CLI command on a pool that the user owns (asyncpg, psycopg, aiosqlite).

$ONCELY_TEST_ENGINE_URL names the engine's database. `hold` keeps its slot until the file
$ONCELY_TEST_SIGNALS/release exists (after creating started-<pid>), so a second `oncely run
--wait` finds it busy and waits on the same pool; `leak` fails with an error that carries a
credential, for the masking tests.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from oncely import Oncely, RetryPolicy, cron

SIGNAL_DIR = Path(os.environ.get("ONCELY_TEST_SIGNALS", "."))
LEAKED = "postgresql://app:S3cr3tPw@db.internal/x?password=S3c&retQ=1 host=db password=Dsn5ecret"

engine = create_async_engine(os.environ["ONCELY_TEST_ENGINE_URL"], pool_size=2, max_overflow=2)
jobs = Oncely(engine)


@jobs.task(queue="mail")
async def send_receipt(db, order_id: int) -> None:  # type: ignore[no-untyped-def]
    await db.execute(sa.text("SELECT CAST(:id AS integer)"), {"id": order_id})


@jobs.task(retry=RetryPolicy(attempts=1))
async def leaky_task(db) -> None:  # type: ignore[no-untyped-def]
    raise RuntimeError(f"cannot reach {LEAKED}")


@jobs.job(cron("0 3 * * *", tz="Europe/Madrid"))
async def purge(db, now):  # type: ignore[no-untyped-def]
    await db.execute(sa.text("SELECT 1"))


@jobs.job(cron("0 4 * * *", tz="Europe/Madrid"))
async def hold(db, now):  # type: ignore[no-untyped-def]
    await db.execute(sa.text("SELECT 1"))
    (SIGNAL_DIR / f"started-{os.getpid()}").touch()
    for _ in range(12000):
        if (SIGNAL_DIR / "release").exists():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("never released")


@jobs.job(cron("0 5 * * *", tz="Europe/Madrid"))
async def leak(db, now):  # type: ignore[no-untyped-def]
    raise RuntimeError(f"cannot reach {LEAKED}")
