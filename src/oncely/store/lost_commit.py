"""What a COMMIT came to when the connection was lost while it was in flight.

The server may have committed before the connection dropped, or not; the client cannot tell
from the error, and the COMMIT may still be running (a synchronous standby, a deferred
trigger) when the client notices. Where the transaction's id was read inside it (Postgres),
these operations ask the server what became of that transaction on a fresh connection, and
wait while it is still in progress; elsewhere (or if the server cannot tell) they read back
the row the transaction wrote: the claim of a slot, or a task by its id. True: it committed;
False: it did not (it rolled back); None: that cannot be learned, the outcome is unknown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from . import sql, task_queue_sql
from .database import Database

CHECK_TRIES = 3
"""Tries to reach the database (a fresh connection each) before answering None."""
CHECK_PAUSE_S = 0.2
"""The pause between two tries."""
XACT_WAIT_S = 30.0
"""How long a transaction whose COMMIT was lost may stay in progress before its outcome is
reported unknown."""
XACT_POLL_S = 0.1
"""The pause between two looks at a transaction still in progress."""


async def _read_back(store: Database, stmt: Any) -> tuple[bool, Any]:
    """(True, the first row of `stmt` or None) read on a fresh connection; (False, None) if
    the database could not be read in CHECK_TRIES tries."""
    # Not a pooled connection: one opened before the loss (an attempt record's) may read
    # before the server has finished the lost COMMIT, and report a landed claim as missing.
    engine = store.dedicated_engine()
    try:
        for attempt in range(CHECK_TRIES):
            if attempt:
                await asyncio.sleep(CHECK_PAUSE_S)
            try:
                async with engine.connect() as conn:
                    row = (await conn.execute(stmt)).first()
                    await conn.rollback()
                return True, row
            except Exception as exc:  # any failure to read back means "unknown"
                logging.getLogger("oncely").debug("reading back a lost COMMIT failed: %s", exc)
        return False, None
    finally:
        if engine is not store.engine:
            await engine.dispose()


async def xact_landed(store: Database, xid: int) -> bool | None:
    """After a lost COMMIT of transaction `xid`: whether it committed, waiting (up to
    XACT_WAIT_S) while the server still runs it; None if that cannot be learned."""
    engine = store.dedicated_engine()
    deadline = time.monotonic() + XACT_WAIT_S
    failures = 0
    try:
        while failures < CHECK_TRIES and time.monotonic() < deadline:
            try:
                async with engine.connect() as conn:
                    status = await store.dialect.xact_status(conn, xid)
                    await conn.rollback()
            except Exception as exc:  # unreachable now: a few more tries, then "unknown"
                logging.getLogger("oncely").debug("asking a lost COMMIT's fate failed: %s", exc)
                failures += 1
                await asyncio.sleep(CHECK_PAUSE_S)
                continue
            if status == "committed":
                return True
            if status == "aborted":
                return False
            if status != "in progress":
                return None  # too old to tell, or no answer
            await asyncio.sleep(XACT_POLL_S)
        return None
    finally:
        if engine is not store.engine:
            await engine.dispose()


async def claim_landed(
    store: Database, job: str, key: str, claimed_by: str, xid: int | None = None
) -> bool | None:
    """After a lost COMMIT of an attempt at (job, key) by `claimed_by` in transaction `xid`
    (if its id was read): whether its claim committed, or None if that cannot be learned."""
    if xid is not None:
        landed = await xact_landed(store, xid)
        if landed is not None:
            return landed
    read, row = await _read_back(store, sql.get_claim(job, key))
    if not read:
        return None
    return row is not None and row.claimed_by == claimed_by


async def task_landed(store: Database, task_id: int, xid: int | None = None) -> bool | None:
    """After a lost COMMIT of an enqueue (in transaction `xid`, if its id was read): whether
    the task row it inserted (by its id, read back from the INSERT) committed, or None if
    that cannot be learned."""
    if xid is not None:
        landed = await xact_landed(store, xid)
        if landed is not None:
            return landed
    read, row = await _read_back(store, task_queue_sql.get(task_id))
    if not read:
        return None
    return row is not None
