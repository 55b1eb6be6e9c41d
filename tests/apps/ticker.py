"""An app whose `every(seconds=1)` jobs insert one row per call: the conformance subject.

`tick` uses catch_up="all" so that no slot is coalesced away (a Postgres restart must not
cost a slot), and overlap="allow" so that only uniqueness is being tested. With
ONCELY_TICK_EXTRA=N the app has N more such jobs (tick_1 … tick_N), to load one database
with several due jobs at once.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from oncely import Oncely, every
from oncely.identity import replica_id

app = Oncely()

APP_TABLES = """
CREATE TABLE IF NOT EXISTS ticks (job varchar(64) NOT NULL, slot varchar(64) NOT NULL,
                                  replica varchar(255) NOT NULL, ran_at varchar(64) NOT NULL)
"""

_INSERT = sa.text("INSERT INTO ticks (job, slot, replica, ran_at) VALUES (:j, :s, :r, :t)")


def _ticker(name: str):  # type: ignore[no-untyped-def]
    async def tick(db, now):  # type: ignore[no-untyped-def]
        await db.execute(
            _INSERT,
            {
                "j": name,
                "s": now.isoformat(),
                "r": replica_id(),
                "t": datetime.now(timezone.utc).isoformat(),
            },
        )

    return tick


for _name in ["tick"] + [
    f"tick_{n}" for n in range(1, int(os.environ.get("ONCELY_TICK_EXTRA", "0")) + 1)
]:
    app.job(
        every(seconds=1), name=_name, catch_up="all", grace=timedelta(minutes=5), overlap="allow"
    )(_ticker(_name))
