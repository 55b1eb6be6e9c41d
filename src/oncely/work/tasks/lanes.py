"""The lanes: up to `concurrency` attempts running at once, and the leased-ahead tasks that
wait for a free lane. A lane's attempt ends in one outcome, recorded for the settler; the
attempts a stall, an operator or the shutdown cancels end as each of them says.

With `group` above 1 and a backlog (more tasks ready than free lanes), a lane runs a group:
up to `group` async tasks one after another in one transaction, a savepoint each (`group`).
A group whose transaction fails as a whole committed nothing: its tasks run again, each on
its own lane. A group that a stall or an operator's cancel stops rolls back whole: the
tasks cancelled end as they would alone, the others run again."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging

from ... import events
from ...errors import OncelyError, TaskCancelledError
from ...store import Leased, WorkerConnections
from ..options import WorkerOptions
from .attempt import AttemptRunner
from .group import Ended, GroupRunner
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
        groups: GroupRunner,
    ) -> None:
        self.conns = conns
        self.options = options
        self.leases = leases
        self.attempts = attempts
        self.settler = settler
        self.groups = groups
        self.busy = 0
        """Lanes running now: an attempt, or a group of them, each."""
        self.alone: set[int] = set()
        """Tasks to run on their own: their group's transaction failed."""
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

    def per_lane(self) -> int:
        """The most tasks a lane runs at once: `group` where groups can run, else 1."""
        return self.options.group if self.groups.possible() else 1

    def free(self) -> int:
        """Room for tasks neither running nor promised to a leased task: those a lease starts
        at once."""
        lanes = self.options.concurrency - self.busy
        return max(0, lanes * self.per_lane() - len(self.ready))

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
        lanes = self._lanes()
        uncounted = [item for lane in lanes for item in lane if not item.counted]
        counting = None
        if uncounted:  # leased ahead: one statement counts their attempts before they start
            counting = asyncio.create_task(self._begin_attempts(uncounted))
            self.counting.add(counting)
            counting.add_done_callback(self.counting.discard)
        for lane in lanes:
            if len(lane) == 1:
                item = lane[0]
                task = asyncio.create_task(self._attempt(item, None if item.counted else counting))
            else:
                task = asyncio.create_task(self._group(lane, counting))
            self.busy += 1
            task.add_done_callback(self._lane_ended)
            for item in lane:
                self.alone.discard(item.id)
                self.running[item.id] = task
                task.add_done_callback(functools.partial(self._ended, item.id))

    def _lanes(self) -> list[list[Leased]]:
        """The ready tasks that start now, a lane each, or a group each when more are ready
        than lanes are free (as many per group as spreads them over the free lanes, or over
        the pool's connections if fewer)."""
        room = self.options.concurrency - self.busy
        ready = self.ready
        if self.stopping or room <= 0 or not ready:
            return []
        size = 1
        if len(ready) > room and self.groups.possible():
            # Spread over the lanes that can hold a connection at once: at most the pool's.
            spread = min(room, self.options.pool_size)
            size = min(self.options.group, -(-len(ready) // spread))
        lanes: list[list[Leased]] = []
        while ready and len(lanes) < room:
            lane = [ready.popleft()]
            if size > 1 and self._groupable(lane[0]):
                while ready and len(lane) < size and self._groupable(ready[0]):
                    lane.append(ready.popleft())
            lanes.append(lane)
        return lanes

    def _groupable(self, item: Leased) -> bool:
        return item.id not in self.alone and self.groups.groupable(item)

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

    def _lane_ended(self, _task: asyncio.Task[None]) -> None:
        self.busy -= 1

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

    async def _group(
        self, items: list[Leased], counting: asyncio.Task[dict[int, int]] | None
    ) -> None:
        try:
            if counting is not None:
                items = await self._counted(items, counting)
            ended = await self.groups.run(items) if items else []
        except asyncio.CancelledError:
            if not self._group_stopped(items):
                raise  # the shutdown's: handed back
            return
        except Exception as exc:
            # Nothing of the group committed (its COMMIT failed, or its connection): each
            # of its tasks runs again, on its own, under the same lease and attempt.
            events.emit(
                "task.group_failed",
                "a group's transaction failed; nothing of it committed, each task runs again alone",
                level=logging.WARNING,
                tasks=len(items),
                ids=[item.id for item in items],
                error=f"{type(exc).__name__}: {exc}",
            )
            self.alone.update(item.id for item in items)
            self.ready.extendleft(reversed(items))
            return
        except BaseException:
            for item in items:  # a simulated crash: the leases stay taken (see _attempt)
                self.leases.drop(item.id)
            raise
        self._record(ended)

    async def _counted(
        self, items: list[Leased], counting: asyncio.Task[dict[int, int]]
    ) -> list[Leased]:
        """The tasks of a group whose attempts were counted as they start (the others' leases
        are no longer this worker's)."""
        counted = await asyncio.shield(counting)
        kept: list[Leased] = []
        for item in items:
            if item.counted:
                kept.append(item)
            elif item.id in counted:
                kept.append(dataclasses.replace(item, attempt=counted[item.id], counted=True))
            else:
                self.leases.drop(item.id)
                self.settler.emit(LeaseLost(item))
        return kept

    def _group_stopped(self, items: list[Leased]) -> bool:
        """A group cancelled by a stall or an operator (False: by the shutdown): its
        transaction rolled back whole. The tasks cancelled end as they would alone (lost, or
        discarded); the others run again."""
        if not any(i.id in self.stalled or i.id in self.cancelling for i in items):
            return False
        again: list[Leased] = []
        for item in items:
            if item.id in self.stalled:
                self.stalled.discard(item.id)
                self.settler.record(LeaseLost(item))
            elif item.id in self.cancelling:
                self.cancelling.discard(item.id)
                error = TaskCancelledError("an operator cancelled the task while it ran")
                self.settler.record(Discarded(item, 0.0, error))
            else:
                again.append(item)
        self.ready.extendleft(reversed(again))
        return True

    def _record(self, ended: list[Ended]) -> None:
        for outcome, written in ended:
            if written:
                self.settler.written(outcome)
            else:
                self.settler.record(outcome)
