"""An app with many cron jobs that are never due during a benchmark (they fire on 1 January)."""

from __future__ import annotations

import os

from oncely import Oncely, cron

app = Oncely()

for _n in range(int(os.environ.get("ONCELY_BENCH_JOBS", "1000"))):

    async def _job(db, now):  # type: ignore[no-untyped-def]
        return None

    app.job(cron(f"{_n % 60} {_n % 24} 1 1 *", tz="America/New_York"), name=f"job_{_n}")(_job)
