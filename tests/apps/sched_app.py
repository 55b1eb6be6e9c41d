"""An app for the tests of schedules kept as data: what a schedule's slot runs writes one
row per call into `effects` (who, the argument, the replica), so a test counts effects.

- `digest`: a task of one tenant (`tenant: str`): what per-customer schedules enqueue;
- `report`: a code job (hourly) that also takes a `tenant` argument, for job targets;
- `nightly`: a code job, whose name no schedule may take.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from oncely import Oncely, cron, every
from oncely.identity import replica_id

app = Oncely()

TABLES = """
CREATE TABLE IF NOT EXISTS effects (what varchar(64) NOT NULL, arg varchar(200) NOT NULL,
                                    replica varchar(255) NOT NULL)
"""
_INSERT = sa.text("INSERT INTO effects (what, arg, replica) VALUES (:w, :a, :r)")


@app.task
async def digest(db, tenant: str) -> None:  # type: ignore[no-untyped-def]
    await db.execute(_INSERT, {"w": "digest", "a": tenant, "r": replica_id()})


@app.job(every(hours=1))
async def report(db, now: datetime, tenant: str = "all") -> None:  # type: ignore[no-untyped-def]
    await db.execute(
        _INSERT, {"w": "report", "a": f"{tenant} {now.isoformat()}", "r": replica_id()}
    )


@app.job(cron("0 3 * * *"))
async def nightly(db, now: datetime) -> None:  # type: ignore[no-untyped-def]
    await db.execute(_INSERT, {"w": "nightly", "a": now.isoformat(), "r": replica_id()})
