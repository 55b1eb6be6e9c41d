"""Leasing: take due tasks in one statement (the attempts that start at once count with it)
and keep up to `concurrency` of them running, plus a few leased ahead; when a lease comes back
short, sleep until a notification, the poll, or the next task's time."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Sequence

from ... import events
from ...errors import OncelyError
from ...store import Leased, WorkerConnections
from ..options import WorkerOptions
from ..outage import Outage
from . import timing
from .lanes import Lanes
from .leases import Leases
from .listener import Listener
from .unrunnable import Unrunnable

logger = logging.getLogger("oncely")
PART = "tasks"
"""Leasing, among the parts of a worker that meet an outage."""


class Leaser:
    """Leases due tasks for the lanes, as long as they have room."""

    def __init__(
        self,
        conns: WorkerConnections,
        options: WorkerOptions,
        names: Sequence[str],
        by: str,
        prefix: str,
        leases: Leases,
        lanes: Lanes,
        listener: Listener,
        unrunnable: Unrunnable,
        outage: Outage,
    ) -> None:
        self.conns = conns
        self.outage = outage
        """The process's database outage, which leasing reports to as the part "tasks"."""
        self.options = options
        self.names = names
        """The task names this worker leases: the ones it registered (a task of a name it
        does not know waits for a worker that knows it, e.g. during a rolling deploy)."""
        self.by = by
        self.leases = leases
        self.lanes = lanes
        self.listener = listener
        self.unrunnable = unrunnable
        self.limited = False
        """Whether a task it leases has a concurrency or rate limit (set by the worker)."""
        self.looked: tuple[int, float] | None = None
        """(news, monotonic deadline) of the last `next_due`: the next look."""
        self._leased_at = time.monotonic()
        """When the last lease began (monotonic)."""
        self._prefix = prefix
        self._counter = itertools.count()

    def token(self) -> str:
        """A lease token for one lease: unique to this worker and this lease."""
        return f"{self._prefix}.{next(self._counter)}"

    async def take(
        self, limit: int, start: int | None = None, *, limited: bool = False
    ) -> list[Leased]:
        """Lease up to `limit` due tasks of this worker's queues and names, now."""
        options = self.options
        return await self.conns.lease(
            options.queues,
            limit,
            self.token(),
            self.by,
            options.lease,
            self.names,
            start,
            limited=limited,
        )

    async def run(self, stopping: asyncio.Event) -> None:
        """Keep up to `concurrency` tasks running and `prefetch` more leased, until stopping."""
        options, leases, lanes, listener = self.options, self.leases, self.lanes, self.listener
        while not stopping.is_set() and lanes.crash is None:
            # With groups, a lane's group is leased too: a backlog to group.
            capacity = options.concurrency * lanes.per_lane() + options.prefetch
            low = max(1, capacity // 4)
            room = capacity - leases.in_flight()  # decided: no longer in flight
            if room < low:
                leases.room.clear()
                await timing.first(stopping, leases.room)
                continue
            want = min(room, options.batch)
            # Cleared before the lease, not after: an outcome written or a task ended while
            # the lease runs (a retry it did not see) wakes the wait below.
            listener.woken.clear()
            leases.room.clear()
            answering = listener.wakeups.take_answering()
            self._leased_at = sent = time.monotonic()
            # The attempts of the tasks that start at once count with the lease; the others'
            # when their bodies start (a worker that dies before spends none of them).
            fetched = await self.fetch(want, stopping, lanes.free())
            leased = fetched or []
            leases.take(leased, sent)
            runnable = self.unrunnable.runnable(leased)
            lanes.start(runnable)
            if len(runnable) < len(leased):
                await self.unrunnable.hand_back([i for i in leased if i not in runnable])
            if answering and fetched is not None and len(leased) < want and lanes.crash is None:
                # The tasks start before the word goes out: they run up to their first
                # wait (a statement, a call) before the word's statement takes the loop.
                await asyncio.sleep(0)
                await listener.say_taken(answering)  # a lease begun after those notifications
            if len(leased) < want:
                # Short: nothing more is due, or the rest waits for a limit's room, which a
                # task of this worker that ends may free: look again then, or when notified,
                # or when the next task comes due.
                wait = await self._next_look(stopping)
                await timing.first(stopping, listener.woken, leases.room, timeout=wait)

    async def fetch(
        self, want: int, stopping: asyncio.Event, start: int | None = None
    ) -> list[Leased] | None:
        """Lease up to `want` due tasks (the attempts of the first `start` counted); None if
        the lease failed (after a pause)."""
        try:
            leased = await self.take(want, start, limited=self.limited)
        except Exception as exc:
            if self.conns.is_unavailable(exc):  # said once per outage, waited out
                self.outage.failed(PART, exc)
                await timing.first(stopping, timeout=self.outage.backoff(PART))
                return None
            if not isinstance(exc, OncelyError):
                raise
            if self.conns.is_busy(exc):
                await timing.first(stopping, timeout=0.05)
            else:
                events.emit(
                    "worker.error", "leasing failed; retrying", level=logging.ERROR, error=str(exc)
                )
                await timing.first(stopping, timeout=1.0)
            return None
        self.outage.answered(PART)
        return leased

    async def _next_look(self, stopping: asyncio.Event) -> float:
        """Seconds until the leaser looks again unless woken: `poll` without notifications;
        with them, when the next task comes due (asked once per news), at most
        LISTENING_POLL_S, or `poll` while a limit holds back tasks that are due (its room
        frees without a notification)."""
        poll = self.options.poll
        listener, wakeups, room = self.listener, self.listener.wakeups, self.leases.room
        if not listener.listening:
            return poll
        news, now = wakeups.news, time.monotonic()
        if self.looked is not None and self.looked[0] == news and self.looked[1] > now:
            return self.looked[1] - now
        await timing.first(stopping, listener.woken, room, timeout=timing.LOOK_AFTER_S)
        if stopping.is_set() or listener.woken.is_set() or room.is_set():
            return 0.0  # woken meanwhile: lease again first
        news = wakeups.news
        try:
            # Since the last lease began (and LOOK_BACK_S before): a task that came due
            # after it looked (a retry this worker wrote meanwhile) is due now, and leased
            # at once.
            later, held = await self.conns.next_due(
                self.options.queues,
                self.names,
                held=self.limited,
                since=time.monotonic() - self._leased_at + timing.LOOK_BACK_S,
            )
        except OncelyError as exc:
            logger.debug("reading when the next task is due failed: %s", exc)
            return poll
        turn = wakeups.next_turn()
        if later is not None and later <= 0 and turn is not None:
            # Due already, while a notification waits for this worker's turn: most likely
            # the task it announced, so look at that turn, not before the first to look.
            later = turn - time.monotonic()
        wait = poll if held else timing.LISTENING_POLL_S if later is None else later
        wait = max(0.0, min(wait, timing.LISTENING_POLL_S))
        self.looked = (news, time.monotonic() + wait)
        return wait
