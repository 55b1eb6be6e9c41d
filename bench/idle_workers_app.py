"""The app of bench/idle.py: a few cron jobs never due during a run (they fire on 1 January),
a few tasks, and `probe`, which records when it started (for the wake-up latency)."""

from __future__ import annotations

import os
import time

import sqlalchemy as sa

from oncely import Oncely, cron

app = Oncely()

PROBES_DDL = (
    "CREATE TABLE IF NOT EXISTS idle_probes (seq integer PRIMARY KEY, started double precision"
    " NOT NULL, pid integer NOT NULL)"
)
_RECORD = sa.text("INSERT INTO idle_probes (seq, started, pid) VALUES (:seq, :started, :pid)")

for _n in range(3):

    async def _job(db, now):  # type: ignore[no-untyped-def]
        return None

    app.job(cron(f"{_n} 3 1 1 *", tz="America/New_York"), name=f"yearly_{_n}")(_job)


@app.task
async def probe(db, seq: int):  # type: ignore[no-untyped-def]
    """Record this attempt's start (this machine's clock, as the enqueuer's commit time)."""
    started = time.time()
    await db.execute(_RECORD, {"seq": seq, "started": started, "pid": os.getpid()})


@app.task
async def send_email(db, to: str):  # type: ignore[no-untyped-def]
    return None


@app.task
async def charge(db, order_id: int):  # type: ignore[no-untyped-def]
    return None
