"""The next release of `queue_app`: the same tasks and one more (`charge`), for a rolling deploy
where workers of both releases run side by side."""

from __future__ import annotations

import os

import sqlalchemy as sa

from oncely import Oncely

app = Oncely()

_INSERT = sa.text("INSERT INTO effects (n, pid) VALUES (:n, :pid)")


@app.task
async def record(db, n: int) -> None:  # type: ignore[no-untyped-def]
    await db.execute(_INSERT, {"n": n, "pid": os.getpid()})


@app.task
async def charge(db, n: int) -> None:  # type: ignore[no-untyped-def]
    """A task only this release knows."""
    await db.execute(_INSERT, {"n": n, "pid": os.getpid()})
