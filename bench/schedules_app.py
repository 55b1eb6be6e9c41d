"""The app of bench/schedules_scale.py: one task that a per-tenant schedule enqueues."""

from __future__ import annotations

from oncely import Oncely

app = Oncely()


@app.task
async def digest(db, tenant: str) -> None:  # type: ignore[no-untyped-def]
    return None
