"""The next release of reliab_app: its `minutely` job is called `every_minute` now (the
release `oncely rename minutely every_minute` is run with)."""

from __future__ import annotations

from oncely import Oncely, every

app = Oncely()


@app.job(every(minutes=1))
async def every_minute(db, now):  # type: ignore[no-untyped-def]
    return None
