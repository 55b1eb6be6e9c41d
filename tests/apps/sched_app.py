"""An app for the tests of schedules kept as data: what a schedule's slot runs writes one
row per call into `effects` (who, the argument, the replica), so a test counts effects.

- `digest`: a task of one tenant (`tenant: str`): what per-customer schedules enqueue;
- `report`: a code job (hourly) that also takes a `tenant` argument, for job targets;
- `nightly`: a code job, whose name no schedule may take.

With $ONCELY_TEST_SCHED_HOLD set, the process stops before the commit of its first schedule
slot (see `_hold_before_commit`).
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from oncely import Oncely, cron, every, hooks
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


def _hold_before_commit() -> None:
    """With $ONCELY_TEST_SCHED_HOLD set, the first slot of a schedule this process is about
    to commit (its claim and its task written) stops there: it creates "<that file>.started"
    and waits for the file itself (a test SIGKILLs the process meanwhile)."""
    hold = os.environ.get("ONCELY_TEST_SCHED_HOLD")
    if not hold:
        return
    held: list[str] = []

    def stop(job: str, key: str) -> None:
        if job.startswith("schedule:") and not held:
            held.append(key)
            Path(f"{hold}.started").write_text(f"{job} {key}")
            while not Path(hold).exists():
                time.sleep(0.05)  # the process is stopped here on purpose

    hooks.add_before_commit(stop)


_hold_before_commit()
