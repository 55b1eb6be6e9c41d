"""An app with one `every(seconds=1)` job that inserts one row per call: the conformance subject.

`tick` uses catch_up="all" so that no slot is coalesced away (a Postgres restart must not
cost a slot), and overlap="allow" so that only uniqueness is being tested.
Env: ONCELY_TICK_SECONDS changes the period; ONCELY_TICK_SLEEP makes each call take longer.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

import sqlalchemy as sa

from oncely import Oncely, every

app = Oncely()

APP_TABLES = """
CREATE TABLE IF NOT EXISTS ticks (slot varchar(64) NOT NULL, replica varchar(255) NOT NULL,
                                  ran_at varchar(64) NOT NULL);
"""

_SLEEP = float(os.environ.get("ONCELY_TICK_SLEEP", "0"))


@app.job(
    every(seconds=int(os.environ.get("ONCELY_TICK_SECONDS", "1"))),
    catch_up="all",
    grace=timedelta(minutes=5),
    overlap="allow",
)
async def tick(db, now):  # type: ignore[no-untyped-def]
    from datetime import datetime, timezone

    from oncely.identity import replica_id

    await db.execute(
        sa.text("INSERT INTO ticks (slot, replica, ran_at) VALUES (:s, :r, :t)"),
        {"s": now.isoformat(), "r": replica_id(), "t": datetime.now(timezone.utc).isoformat()},
    )
    if _SLEEP:
        await asyncio.sleep(_SLEEP)
