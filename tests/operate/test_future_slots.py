"""Nothing not yet due runs early through the Python API either: `app.run` / `app.attempt`
with a `now` later than the database's clock are refused unless `allow_future=True`, as
`oncely run --now`, backfill and the dashboard refuse them (docs/design/fate.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from oncely import Oncely, every
from oncely.errors import BadInputError


async def test_app_run_refuses_a_future_slot_unless_allowed(db_url: str) -> None:
    app = Oncely(db_url)
    calls = []

    @app.job(every(minutes=1))
    async def tick(db, now):  # type: ignore[no-untyped-def]
        calls.append(now)

    try:
        await app.migrate()
        ahead = await app.store.database_time() + timedelta(minutes=10)
        with pytest.raises(BadInputError, match="ahead of the database's clock"):
            await app.run("tick", now=ahead)
        with pytest.raises(BadInputError, match="ahead of the database's clock"):
            await app.attempt("tick", now=ahead)
        assert calls == [] and await app.history("tick", 10) == []
        ran = await app.run("tick", now=ahead, allow_future=True)
        assert ran.status.value == "ran" and len(calls) == 1
        due = await app.store.database_time() - timedelta(minutes=1)
        assert (await app.run("tick", now=due)).status.value == "ran"
    finally:
        await app.aclose()
