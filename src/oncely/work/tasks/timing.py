"""How long the task worker's parts wait: every constant of their timing, and their one way
to wait. The parts read these at the time they wait, not at import."""

from __future__ import annotations

import asyncio

CANCEL_CHECK_S = 2.0
"""Seconds between a busy worker's looks for operators' cancel requests of its tasks."""
HELPERS_END_S = 5.0
"""Seconds a stopping worker waits for its heartbeat, rescuer and settler to finish the
statement under way before it cancels them."""
POOL_IDLE_S = 5.0
"""Seconds a connection of the pool may stay idle before the worker closes it: after a
burst, the worker goes back to holding only the connections its tasks use."""
LISTENING_POLL_S = 10.0
"""Seconds between an idle worker's looks for due tasks while notifications wake it (else
`poll`): the look finds what no notification announced (tasks handed back or retried by
other workers, an operator's retry); a task due later wakes the worker at its time."""
LOOK_AFTER_S = 0.05
"""Seconds an idle worker lets pass after news before it asks when the next task is due:
when a notification wakes every idle worker, the one that leased the task starts it first,
the others' questions come after (a task due sooner than this starts this much late)."""
LOOK_BACK_S = 1.0
"""Seconds the look after a short lease reaches back before that lease began: it counts the
tasks due since then, measured on this worker's clock, and its statement may reach the
server later after that reading than the lease's did (a busy event loop, a prepare, a slow
round trip); a task due in that gap was not due for the lease and would not be counted. A
task counted that the lease could not take (a row another transaction held) makes one more
lease per look, for at most this long."""
LISTEN_RETRY_FIRST_S = 1.0
LISTEN_RETRY_MAX_S = 300.0
"""Seconds before a worker tries LISTEN again after it failed or its connection was lost
(doubling from the first to the max; the worker polls every `poll` meanwhile)."""
ANNOUNCE_EVERY = 10.0
"""Seconds between a worker's signs of life in `oncely_workers`; one not seen for three of
them is taken for dead."""
TURN_S = 0.02
"""Seconds between two idle workers' turns at one notification (see `wakeups.Wakeups`): longer
than the first one's lease and its word that it is answered take to reach the others (a few
milliseconds, more while twenty processes wake at once on two cores), so that the next one
looks only if the first did not take the task (no room, a failed lease, a dead worker)."""
ANSWERS_AT_MOST = 100
"""Notifications a worker says are answered in one payload, at most (the others then look at
their turns)."""
STALL_TICK_S = 0.25
"""Seconds between a worker's looks at its own clock: after a stall (SIGSTOP, a suspended
VM, an event loop blocked) the first look comes before the tasks the wake-up resumes, and
cancels the attempts whose leases may have run out meanwhile."""
STALL_S = 1.0
"""Seconds between two looks at the clock that make a stall (the looks come every
STALL_TICK_S when the event loop runs)."""
UNRUNNABLE_WAIT_FIRST = 1.0
UNRUNNABLE_WAIT_MAX = 10.0
"""Seconds a task a worker cannot run waits before it is due again: the first time a worker
hands it back, then doubling each time the same worker does, up to the max."""
TURNED_AWAY_AT_MOST = 10_000
"""Tasks a worker remembers having handed back as unrunnable (their growing delays)."""


async def first(
    stopping: asyncio.Event, *others: asyncio.Event, timeout: float | None = None
) -> None:
    """Wait until `stopping` or one of `others` is set, or `timeout` seconds pass."""
    if stopping.is_set() or any(e.is_set() for e in others):
        return
    waiters = [asyncio.ensure_future(e.wait()) for e in (stopping, *others)]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
