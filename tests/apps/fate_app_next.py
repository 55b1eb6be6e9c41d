"""The next release of `fate_app`: `eff` takes a currency (a rolling deploy's new argument)."""

from __future__ import annotations

import os

import sqlalchemy as sa

from oncely import Oncely

app = Oncely()

_INSERT = sa.text("INSERT INTO effects (n, pid) VALUES (:n, :pid)")


@app.task
async def eff(db, n: int, currency: str = "usd") -> None:  # type: ignore[no-untyped-def]
    await db.execute(_INSERT, {"n": n if currency == "usd" else 1000 + n, "pid": os.getpid()})
