"""What a COMMIT came to when the connection was lost while it was in flight.

The server may have committed before the connection dropped, or not; the client cannot tell
from the error. These operations reconnect and read the row the transaction wrote: the
claim of a slot, or a task by its id. True: it committed; False: it did not (it rolled
back); None: the database cannot be read either, so the outcome is unknown.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from . import sql, tasks_sql

if TYPE_CHECKING:
    from . import Store

CHECK_TRIES = 3
"""Tries to read the row back (a fresh connection each) before answering None."""
CHECK_PAUSE_S = 0.2
"""The pause between two tries."""


async def _read_back(store: Store, stmt: Any) -> tuple[bool, Any]:
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


async def claim_landed(store: Store, job: str, key: str, claimed_by: str) -> bool | None:
    """After a lost COMMIT of an attempt at (job, key) by `claimed_by`: whether its claim
    committed (the ledger row is this replica's), or None if that cannot be read back."""
    read, row = await _read_back(store, sql.get_claim(job, key))
    if not read:
        return None
    return row is not None and row.claimed_by == claimed_by


async def task_landed(store: Store, task_id: int) -> bool | None:
    """After a lost COMMIT of an enqueue: whether the task row it inserted (by its id, read
    back from the INSERT) committed, or None if that cannot be read back."""
    read, row = await _read_back(store, tasks_sql.get(task_id))
    if not read:
        return None
    return row is not None
