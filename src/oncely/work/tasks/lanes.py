"""The lanes: up to `concurrency` attempts running at once, and the leased-ahead tasks that
wait for a free lane. A lane's attempt ends in one outcome, recorded for the settler; the
attempts a stall, an operator or the shutdown cancels end as each of them says."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging

from ...errors import OncelyError, TaskCancelledError
from ...store import Leased, WorkerConnections
from ..options import WorkerOptions
from .attempt import AttemptRunner
from .leases import Leases
from .outcome import Discarded, LeaseLost
from .settler import Settler

logger = logging.getLogger("oncely")


class Lanes:
    """Starts leased tasks as lanes free up, and knows which attempts run."""

    def __init__(
        self,
        conns: WorkerConnections,
        options: WorkerOptions,
        leases: Leases,
        attempts: AttemptRunner,
        settler: Settler,
    ) -> None:
        self.conns = conns
        self.options = options
        self.leases = leases
        self.attempts = attempts
        self.settler = settler
        self.ready: collections.deque[Leased] = collections.deque()
        """Leased tasks waiting for a lane."""
        self.running: dict[int, asyncio.Task[None]] = {}
        self.counting: set[asyncio.Task[dict[int, int]]] = set()
        """Statements under way that count the attempts of leased-ahead tasks starting now."""
        self.stalled: set[int] = set()
        """Running tasks whose attempts a stall cancelled (their leases may have run out)."""
        self.cancelling: set[int] = set()
        """Running tasks an operator cancelled: their attempts are being stopped."""
        self.crash: BaseException | None = None
        """A BaseException an attempt let through (a simulated crash): the worker stops."""
        self.stopping = False
        """Set by the shutdown: no task starts any more."""
        self._soon: asyncio.Handle | None = None
        """A dispatch due at the loop's next turn, for the attempts that ended in this one."""

    def free(self) -> int:
        """Lanes neither running nor promised to a leased task: those a lease starts at once."""
        return max(0, self.options.concurrency - len(self.running) - len(self.ready))

    def start(self, items: list[Leased]) -> None:
        """Run `items` as lanes free up, in order."""
        self.ready.extend(items)
        self._dispatch()

    def take_ready(self) -> list[Leased]:
        """The leased tasks that never started (the shutdown hands them back)."""
        ready = list(self.ready)
        self.ready.clear()
        return ready

    def cancel(self, task_ids: list[int]) -> None:
        """Stop the attempts an operator asked to cancel: rolled back, ended discarded."""
        for task_id in task_ids:
            attempt = self.running.get(task_id)
            if attempt is not None:
                self.cancelling.add(task_id)
                attempt.cancel()

    def cancel_stalled(self, task_ids: list[int]) -> None:
        """Stop the attempts whose leases may have run out in a stall: ended as lost."""
        for task_id in task_ids:
            self.stalled.add(task_id)
            self.running[task_id].cancel()

    async def wait_running(self) -> None:
        """Wait until no attempt runs."""
        while self.running:
            await asyncio.wait(list(self.running.values()))

    async def cancel_running(self) -> None:
        """Cancel the attempts still running (the shutdown's: handed back) and wait for them."""
        running = list(self.running.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    def _dispatch(self) -> None:
        starting: list[Leased] = []
        room = self.options.concurrency - len(self.running)
        while self.ready and not self.stopping and len(starting) < room:
            starting.append(self.ready.popleft())
        uncounted = [item for item in starting if not item.counted]
        counting = None
        if uncounted:  # leased ahead: one statement counts their attempts before they start
            counting = asyncio.create_task(self._begin_attempts(uncounted))
            self.counting.add(counting)
            counting.add_done_callback(self.counting.discard)
        for item in starting:
            task = asyncio.create_task(self._attempt(item, None if item.counted else counting))
            self.running[item.id] = task
            task.add_done_callback(functools.partial(self._ended, item.id))

    async def _begin_attempts(self, items: list[Leased]) -> dict[int, int]:
        """Count the attempts of leased-ahead tasks whose bodies start now; {id: attempt} of
        those whose leases are still this worker's (the others are no longer its to run)."""
        try:
            counted = await self.conns.begin_attempts(items)
        except OncelyError as exc:  # uncounted: their leases run out, the rescuer hands them on
            logger.debug("counting the attempts of starting tasks failed: %s", exc)
            counted = {}
        held = self.leases.held
        for item in items:
            if item.id in counted and item.id in held:
                held[item.id] = dataclasses.replace(item, attempt=counted[item.id], counted=True)
        return counted

    def _ended(self, task_id: int, task: asyncio.Task[None]) -> None:
        if self.running.get(task_id) is task:
            del self.running[task_id]
        if not task.cancelled() and task.exception() is not None and self.crash is None:
            self.crash = task.exception()  # a BaseException the attempt let through
        self.leases.room.set()
        # Attempts that end together (done callbacks of one loop turn) free their lanes in
        # one dispatch: the leased-ahead tasks that take them are counted in one statement,
        # not one statement each.
        if self._soon is None:
            self._soon = asyncio.get_running_loop().call_soon(self._dispatch_soon)

    def _dispatch_soon(self) -> None:
        self._soon = None
        self._dispatch()

    async def _attempt(
        self, item: Leased, counting: asyncio.Task[dict[int, int]] | None = None
    ) -> None:
        try:
            if counting is not None:
                counted = await asyncio.shield(counting)
                if item.id not in counted:  # the lease is no longer this worker's
                    self.leases.drop(item.id)
                    self.settler.emit(LeaseLost(item))
                    return
                item = dataclasses.replace(item, attempt=counted[item.id], counted=True)
            outcome = await self.attempts.run(item)
        except asyncio.CancelledError:
            if item.id in self.stalled:  # a stall past the lease: nothing committed
                self.stalled.discard(item.id)
                self.settler.record(LeaseLost(item))
                return
            if item.id not in self.cancelling:
                raise  # the shutdown's: handed back
            self.cancelling.discard(item.id)  # an operator's: rolled back, discarded
            error = TaskCancelledError("an operator cancelled the task while it ran")
            self.settler.record(Discarded(item, 0.0, error))
            return
        except Exception:
            raise
        except BaseException:
            # A simulated crash (the testing toolkit): the lease stays taken, as a killed
            # worker's would, until it runs out.
            self.leases.drop(item.id)
            raise
        self.settler.record(outcome)
