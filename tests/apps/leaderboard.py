"""The incident's app, for tests that run `oncely` in real processes.

`leaderboard_close` pays the week's top 3 members +10 coins and notifies them, every Friday
18:00 in Mexico City. Other jobs misbehave on purpose: raise after writing, hang after
writing (to be SIGKILLed or to hold a slot), or commit on their own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import sqlalchemy as sa

from oncely import Oncely, cron

app = Oncely()

TOP3 = ("ana", "beto", "carla")
SIGNAL_DIR = Path(os.environ.get("ONCELY_TEST_SIGNALS", "."))

APP_TABLES = (
    "CREATE TABLE IF NOT EXISTS coins (member varchar(50), amount integer, slot varchar(64))",
    "CREATE TABLE IF NOT EXISTS notifications (member varchar(50), body varchar(200))",
)


def create_tables(engine: sa.Engine) -> None:
    """The app's own tables (a real app would have them from its migrations)."""
    with engine.begin() as conn:
        for statement in APP_TABLES:
            conn.exec_driver_sql(statement)


async def _pay_top3(db, now) -> None:  # type: ignore[no-untyped-def]
    for member in TOP3:
        await db.execute(
            sa.text("INSERT INTO coins (member, amount, slot) VALUES (:m, 10, :s)"),
            {"m": member, "s": now.isoformat()},
        )
        await db.execute(
            sa.text("INSERT INTO notifications (member, body) VALUES (:m, :b)"),
            {"m": member, "b": "You're top 3! +10 coins"},
        )


def _wait_for(name: str, limit: float = 120.0) -> None:
    """Block until the test creates SIGNAL_DIR/name (or give up after `limit` seconds)."""
    deadline = time.monotonic() + limit
    while not (SIGNAL_DIR / name).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(name)
        time.sleep(0.01)


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
async def leaderboard_close(db, now):  # type: ignore[no-untyped-def]
    await _pay_top3(db, now)


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
async def close_then_fail(db, now):  # type: ignore[no-untyped-def]
    await _pay_top3(db, now)
    raise RuntimeError("leaderboard service exploded after paying")


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
async def close_when_up(db, now):  # type: ignore[no-untyped-def]
    """Pays, then fails while the test's `fail` file exists (a transient outage)."""
    await _pay_top3(db, now)
    if (SIGNAL_DIR / "fail").exists():
        raise ConnectionError("the leaderboard service is down")


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
def close_then_hang(db, now):  # type: ignore[no-untyped-def]
    """Pays (in the open transaction), says so, then waits for the test's `release` file."""
    db.execute(
        sa.text("INSERT INTO coins (member, amount, slot) VALUES ('ana', 10, :s)"),
        {"s": now.isoformat()},
    )
    db.flush()
    (SIGNAL_DIR / f"started-{os.getpid()}").touch()
    _wait_for("release")


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
async def close_and_commit(db, now):  # type: ignore[no-untyped-def]
    await _pay_top3(db, now)
    await db.commit()
