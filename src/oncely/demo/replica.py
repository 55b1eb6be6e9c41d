"""One replica of the demo, as its own OS process, ticking when the demo says so.

The process is `python -m oncely.cli.demo_replica REPLICA` (the `oncely` command lives above
the demo, so the process that runs it is started from there), with the database in
$ONCELY_DATABASE_URL (never on the command line, where a password would show in `ps`). Each
line on stdin, `SCENARIO TIME`, is one tick of that scenario at that simulated time; after each
tick the replica writes `DONE <exit code>` on stdout and `DONE` on stderr. The demo starts the
three replicas up front and sends each tick in turn, so the interpreter's start-up does not
count against the simulated minute between replicas.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
from collections.abc import Callable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from ..store import normalize_url
from . import leaderboard

APP_SPEC = "oncely.demo.leaderboard:app"
DONE = "DONE"


def _no_implicit_transactions(dbapi_connection: Any, _record: Any) -> None:
    # SQLite: let the tick issue BEGIN IMMEDIATE itself, and never wait for the write lock.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout = 0")
    cursor.close()


async def tick(scenario: str, replica: str, now: datetime) -> str:
    """One tick of the hand-written worker loop (attempt 1 or 2), in a fresh connection."""
    url = normalize_url(os.environ["ONCELY_DATABASE_URL"])
    engine = create_async_engine(url, poolclass=NullPool)
    if engine.dialect.name == "sqlite":
        sa.event.listen(engine.sync_engine, "connect", _no_implicit_transactions)
    ticks = {"naive": leaderboard.naive_tick, "sentinel": leaderboard.sentinel_tick}
    try:
        async with engine.connect() as conn:
            return await ticks[scenario](conn, scenario, now, replica)
    finally:
        await engine.dispose()


RunOncely = Callable[[str, str], int]
"""`oncely run leaderboard_close --now NOW` as replica REPLICA: (replica, now) -> exit code."""


def turn(scenario: str, replica: str, now: str, run_oncely: RunOncely) -> int:
    """One tick; its exit code (0 ok, 1 the tick failed)."""
    try:
        if scenario == leaderboard.ONCELY_SCENARIO:
            return run_oncely(replica, now)
        print(asyncio.run(tick(scenario, replica, datetime.fromisoformat(now))), flush=True)
    except Exception:
        traceback.print_exc()
        return 1
    return 0


def serve(argv: list[str], run_oncely: RunOncely) -> int:
    """Tick on each line of stdin until it closes; `run_oncely` runs oncely's scenario."""
    [replica] = argv
    for line in sys.stdin:  # until the demo closes our stdin
        scenario, now = line.split()
        code = turn(scenario, replica, now, run_oncely)
        print(f"{DONE} {code}", flush=True)
        print(DONE, file=sys.stderr, flush=True)
    return 0
