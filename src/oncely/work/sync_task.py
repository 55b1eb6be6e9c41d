"""A plain `def` task's body, run in a worker thread: the user's code, outside the store.

The store lends the task a synchronous session (`TaskQueue.sync_session`) and commits its
work with its ack (`TaskQueue.commit_sync`); between the two, only the task's own code runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..store import Fence, Leased, TaskQueue


def run_sync_attempt(
    tasks: TaskQueue,
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
    session, touched = tasks.sync_session(eager=eager)
    try:
        result = encode(func(session, **item.args))
        return tasks.commit_sync(session, touched, item, fence, result), result
    finally:
        tasks.close_sync(session)
