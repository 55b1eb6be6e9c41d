"""A plain `def` task's body, run in a worker thread: the user's code, outside the store.

The worker's connections (the store's `WorkerConnections`) lend the task a synchronous
session and commit its work with its ack; between the two, only the task's own code runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..store import Fence, Leased, WorkerConnections

SyncCall = Callable[[], tuple[bool | None, str | None]]
"""A sync task's attempt, to run in a thread: (True: its work and ack committed; False: its
lease was lost; None: it made no statement, its ack is the settler's), and its result."""


def run_sync_attempt(
    conns: WorkerConnections,
    func: Any,
    item: Leased,
    fence: Fence,
    encode: Callable[[Any], str | None],
    *,
    eager: bool = False,
) -> tuple[bool | None, str | None]:
    """Run a plain `def` task in this (worker) thread, in its own transaction on a
    synchronous session; (True if its work and ack committed, False if its lease was lost,
    None if it made no statement: its ack is then the worker's to write; its return value
    as `encode` made it JSON text, stored with the success)."""
    session, touched = conns.sync_session(eager=eager)
    try:
        result = encode(func(session, **item.args))
        return conns.commit_sync(session, touched, item, fence, result), result
    finally:
        conns.close_sync(session)
