"""An app whose every-second job `report` writes one row per call into `effects` (job, slot)
and raises at the slot $ONCELY_TEST_FAIL_AT (given up at its first failure); the next
release, `rename_app_next`, calls the same job `daily_report`."""

from __future__ import annotations

import os
from datetime import datetime

import sqlalchemy as sa

from oncely import Oncely, RetryPolicy, every

app = Oncely()

_INSERT = sa.text("INSERT INTO effects (job, slot, replica) VALUES (:j, :s, 'rename')")


def reporting(name: str):  # type: ignore[no-untyped-def]
    async def job(db, now: datetime):  # type: ignore[no-untyped-def]
        if now.isoformat() == os.environ.get("ONCELY_TEST_FAIL_AT"):
            raise RuntimeError("report service down")
        await db.execute(_INSERT, {"j": name, "s": now.isoformat()})

    return job


app.job(every(seconds=1), name="report", retry=RetryPolicy(attempts=1))(reporting("report"))
