"""Upkeep while the worker runs: heartbeats (and the stall watch that stops attempts whose
leases may have run out), the rescue of other workers' expired leases, this worker's presence
among the live workers, and the watch for operators' cancels."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from ... import events
from ...errors import OncelyError
from ...store import WorkerConnections
from ..options import WorkerOptions
from . import timing
from .lanes import Lanes
from .leases import Leases
from .listener import Listener

logger = logging.getLogger("oncely")


class Upkeep:
    """The worker's background loops, each until `closing` (the stall watch: until `stop`)."""

    def __init__(
        self,
        conns: WorkerConnections,
        options: WorkerOptions,
        leases: Leases,
        lanes: Lanes,
        listener: Listener,
        worker_id: str,
        names: Sequence[str],
    ) -> None:
        self.conns = conns
        self.options = options
        self.leases = leases
        self.lanes = lanes
        self.listener = listener
        self.worker_id = worker_id
        self.names = names
        self._ticked = time.monotonic()
        self._tick: asyncio.TimerHandle | None = None

    def loops(self, closing: asyncio.Event) -> list[asyncio.Task[None]]:
        """Start the loops (and the stall watch); they end when `closing` is set."""
        self._ticked = time.monotonic()
        self._tick = asyncio.get_running_loop().call_later(timing.STALL_TICK_S, self._watch_clock)
        return [
            asyncio.create_task(self.keep_leases(closing)),
            asyncio.create_task(self.rescue(closing)),
            asyncio.create_task(self.announce(closing)),
            asyncio.create_task(self.watch_cancels(closing)),
        ]

    def stop(self) -> None:
        """Stop the stall watch."""
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    async def keep_leases(self, stopping: asyncio.Event) -> None:
        """Renew the lease of every task this worker holds, every `lease / 3`, until
        stopping; a task missing from the answer has lost its lease (its ack will fail)."""
        interval = self.options.lease / 3
        held, renewed = self.leases.held, self.leases.renewed
        while not stopping.is_set():
            await timing.first(stopping, timeout=interval)
            await self.conns.trim_pool(timing.POOL_IDLE_S)
            for task_id in [i for i in renewed if i not in held]:
                del renewed[task_id]
            holding = list(held.values())
            if not holding:
                continue
            sent = time.monotonic()
            try:
                answered = await self.conns.heartbeat(holding, self.options.lease)
            except OncelyError as exc:
                logger.debug("heartbeat failed: %s", exc)
                continue
            for task_id in answered:
                if task_id in renewed:
                    renewed[task_id] = sent
            for item in holding:
                if item.id not in answered and item.id in held:
                    logger.debug("lease of task %s not renewed (busy or lost)", item.id)

    def _watch_clock(self) -> None:
        """A plain callback of the event loop, every STALL_TICK_S: after a stall (STALL_S or
        more between two looks) it runs in the loop's first round, before the tasks that
        round wakes go on, and cancels the running attempts whose leases may have run out
        meanwhile (`lease` seconds since the statement that last renewed them was sent:
        another worker may run them now); their transactions roll back, they end as a lost
        lease."""
        now = time.monotonic()
        gap, self._ticked = now - self._ticked, now
        self._tick = asyncio.get_running_loop().call_later(timing.STALL_TICK_S, self._watch_clock)
        if gap < timing.STALL_S:
            return
        lease, renewed, stalled = self.options.lease, self.leases.renewed, self.lanes.stalled
        late = [
            task_id
            for task_id in self.lanes.running
            if task_id not in stalled and now - renewed.get(task_id, now) >= lease
        ]
        self.lanes.cancel_stalled(late)
        if late:
            events.emit(
                "worker.stalled",
                "this worker did not run for a while; the attempts whose leases may have run "
                "out were cancelled before they went on",
                level=logging.WARNING,
                seconds=round(gap, 3),
                cancelled=len(late),
            )

    async def rescue(self, stopping: asyncio.Event) -> None:
        """Make the tasks whose lease ran out (their worker died) available again, every
        `lease / 2` (10 s at most), and look for them at once."""
        interval = max(0.05, min(self.options.lease / 2, 10.0))
        while not stopping.is_set():
            try:
                for row in await self.conns.rescue():
                    events.emit(
                        "task.lease_expired",
                        "its worker stopped renewing the lease; available again",
                        level=logging.WARNING,
                        task=row.task,
                        id=row.id,
                        attempt=row.attempt,
                        locked_by=row.locked_by,
                    )
                    self.listener.notify()
            except OncelyError as exc:
                logger.debug("rescue failed: %s", exc)
            await timing.first(stopping, timeout=interval)

    async def announce(self, stopping: asyncio.Event) -> None:
        """Say every ANNOUNCE_EVERY seconds that this worker lives and which task names it
        leases (what `oncely tasks` reads to name the tasks no live worker can run); where
        notifications wake workers, read its place among them after each sign of life, and
        at once whenever a worker says it started or stopped (its own first sign of life
        says so)."""
        first = True
        due = time.monotonic()
        notifies = self.conns.notifies
        roll_call = self.listener.roll_call
        while not stopping.is_set():
            try:
                if time.monotonic() >= due:
                    due = time.monotonic() + timing.ANNOUNCE_EVERY
                    await self.conns.announce(self.worker_id, self.names, first=first)
                    if first and notifies:
                        await self.listener.say_roll_call()
                    first = False
                if notifies:
                    roll_call.clear()
                    within = 3 * timing.ANNOUNCE_EVERY
                    self.listener.wakeups.place = await self.conns.place(self.worker_id, within)
            except OncelyError as exc:
                logger.debug("announcing the worker failed: %s", exc)
            wait = max(0.0, due - time.monotonic())
            await timing.first(stopping, roll_call, timeout=wait)

    async def watch_cancels(self, stopping: asyncio.Event) -> None:
        """Every CANCEL_CHECK_S while tasks run: stop those an operator asked to cancel
        (`oncely tasks cancel`): their transactions roll back and they end discarded."""
        while not stopping.is_set():
            await timing.first(stopping, timeout=timing.CANCEL_CHECK_S)
            running = [i for i in self.lanes.running if i not in self.lanes.cancelling]
            if not running:
                continue
            try:
                asked = await self.conns.cancel_requested(running)
            except OncelyError as exc:
                logger.debug("reading cancel requests failed: %s", exc)
                continue
            self.lanes.cancel(list(asked))
