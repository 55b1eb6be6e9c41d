"""One replica of the demo, as its own OS process, ticking when the demo says so.

`python -m oncely.demo.replica REPLICA` with the database in $ONCELY_DATABASE_URL (never on
the command line, where a password would show in `ps`). Each line on stdin, `SCENARIO TIME`,
is one tick of that scenario at that simulated time; after each tick the replica writes
`DONE <exit code>` on stdout and `DONE` on stderr. The demo starts the three replicas up front
and sends each tick in turn, so the interpreter's start-up does not count against the
simulated minute between replicas.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
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


def run_oncely(replica: str, now: str) -> int:
    """`oncely run leaderboard_close --now NOW`, the real command, in this process."""
    from ..cli import cli

    os.environ[leaderboard.REPLICA_ENV] = replica
    try:
        cli.main(
            args=["--app", APP_SPEC, "run", "leaderboard_close", "--now", now],
            prog_name="oncely",
        )
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def turn(scenario: str, replica: str, now: str) -> int:
    """One tick; its exit code (0 ok, 1 the tick failed)."""
    try:
        if scenario == leaderboard.ONCELY_SCENARIO:
            return run_oncely(replica, now)
        print(asyncio.run(tick(scenario, replica, datetime.fromisoformat(now))), flush=True)
    except Exception:
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str]) -> int:
    [replica] = argv
    for line in sys.stdin:  # until the demo closes our stdin
        scenario, now = line.split()
        code = turn(scenario, replica, now)
        print(f"{DONE} {code}", flush=True)
        print(DONE, file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
