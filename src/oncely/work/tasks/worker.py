"""The task worker: its parts put together, and its shutdown.

The leaser (`leaser`) takes due tasks in one statement and the lanes (`lanes`) run up to
`concurrency` of them, each attempt (`attempt`) in a transaction of its own on the worker's
bounded pool; the settler (`settler`) writes what their outcomes left to write, many in one
statement. Upkeep (`upkeep`) renews the leases the worker holds, rescues tasks whose lease ran
out, keeps the worker among the live ones and stops the attempts operators cancel. The listener
(`listener`) keeps LISTEN up on Postgres and wakes the leaser at this worker's turn at a
notification (`wakeups`, pure). Every statement goes through the one `WorkerConnections` the
store hands the worker (`store.worker_connections()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from ... import events, tracing
from ...errors import OncelyError
from ...identity import replica_id
from ...store import Leased, Store
from ...tasks import TaskRegistry
from ..options import WorkerOptions
from ..outage import Outage
from . import timing
from .attempt import AttemptRunner
from .group import GroupRunner
from .lanes import Lanes
from .leaser import Leaser
from .leases import Leases
from .listener import Listener
from .outcome import Outcome
from .settler import Settler, Spans
from .unrunnable import Unrunnable
from .upkeep import Upkeep
from .wakeups import Wakeups, scope_of

logger = logging.getLogger("oncely")


class TaskWorker:
    """Runs the tasks of a registry from a store, as `options` say."""

    def __init__(
        self,
        store: Store,
        tasks: TaskRegistry,
        options: WorkerOptions,
        *,
        outage: Outage | None = None,
    ) -> None:
        self.store = store
        self.tasks = tasks
        self.options = options
        self.by = replica_id()
        self.names = sorted(task.name for task in tasks)
        prefix = uuid.uuid4().hex[:16]
        self.id = f"{self.by}/{prefix}"
        """This worker, among the live ones (`oncely_workers`)."""
        self.handed_back = 0
        """Tasks whose attempts the shutdown cancelled and handed back."""
        self.outage = outage = outage or Outage(self.by)
        """The process's database outage: leasing and LISTEN report to it."""
        self.conns = conns = store.worker_connections()
        self.leases = leases = Leases()
        self.wakeups = Wakeups(scope_of(options.queues, self.names))
        self.listener = listener = Listener(conns, self.wakeups, outage)
        spans: Spans = {}
        self.settler = Settler(conns, leases, self.wakeups, spans)
        self.attempts = AttemptRunner(conns, tasks, options, spans)
        self.groups = GroupRunner(conns, tasks, options, spans, self.attempts)
        self.lanes = Lanes(conns, options, leases, self.attempts, self.settler, self.groups)
        self.unrunnable = Unrunnable(conns, tasks, leases, self.id)
        self.leaser = Leaser(
            conns,
            options,
            self.names,
            self.by,
            prefix,
            leases,
            self.lanes,
            listener,
            self.unrunnable,
            outage,
        )
        self.leaser.limited = any(
            task.limits.concurrency is not None or task.limits.rate is not None for task in tasks
        )
        self.upkeep = Upkeep(conns, options, leases, self.lanes, listener, self.id, self.names)

    @property
    def held(self) -> dict[int, Leased]:
        """Leased tasks whose outcome is not written yet: what the heartbeat renews."""
        return self.leases.held

    @property
    def listening(self) -> bool:
        """Whether notifications wake this worker now (LISTEN up, and its probe came back)."""
        return self.listener.listening

    def token(self) -> str:
        """A lease token for one lease: unique to this worker and this lease."""
        return self.leaser.token()

    def notify(self, key: str | None = None) -> None:
        """New tasks may be due: the leaser looks at once, or at this worker's turn at the
        notification `key` (see `wakeups`)."""
        self.listener.notify(key)

    # -- running ------------------------------------------------------------------------

    async def consume(self, stopping: asyncio.Event) -> None:
        """Run until `stopping` is set and the tasks in flight end; cancelling the call rolls
        back the tasks still running and hands them back."""
        await self.conns.ensure_schema()
        tracing.warm()  # before the first lease: not between a task's lease and its start
        self.conns.open(self.options.pool_size)
        try:
            await self._serve(stopping)
        finally:
            await self.conns.close_pool()
            self.attempts.close()
            await self.conns.close()

    async def _serve(self, stopping: asyncio.Event) -> None:
        closing = asyncio.Event()  # the helpers end their loops (no statement cut short)
        helpers = [
            *self.upkeep.loops(closing),
            asyncio.create_task(self.settler.run(closing)),
            asyncio.create_task(self.listener.keep_listening(closing)),
        ]
        lanes = self.lanes
        try:
            await self.leaser.run(stopping)
            lanes.stopping = True
            await self._hand_back_unstarted()
            await lanes.wait_running()
            await self.settler.flush()
            if lanes.crash is not None:
                raise lanes.crash
        finally:
            lanes.stopping = True
            self.upkeep.stop()
            self.listener.stop()
            await lanes.cancel_running()
            closing.set()
            _, late = await asyncio.wait(helpers, timeout=timing.HELPERS_END_S)
            for helper in late:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await asyncio.shield(self._finish())

    async def step(self, limit: int | None = None) -> list[Outcome]:
        """Lease the due tasks once (at most `limit`), run them, write their outcomes; the
        outcomes, in lease order. The worker's one step, for tests and the testing toolkit
        (`keep_leases` renews the leases meanwhile, if the tasks are slow)."""
        options = self.options
        await self.conns.ensure_schema()  # once: what the schema keeps (an error history)
        leased = await self.leaser.take(limit or options.batch)
        self.leases.take(leased)
        runnable = self.unrunnable.runnable(leased)
        if len(runnable) < len(leased):
            await self.unrunnable.hand_back([i for i in leased if i not in runnable])
            leased = runnable
        gate = asyncio.Semaphore(options.concurrency)

        async def bounded(item: Leased) -> Outcome:
            async with gate:
                return await self.run(item)

        temporary = self.conns.pool is None
        try:
            outcomes = list(await asyncio.gather(*(bounded(item) for item in leased)))
        except BaseException:
            for item in leased:
                self.leases.drop(item.id)
            raise
        finally:
            if temporary:
                await self.conns.close_pool()
        return await self.settle(outcomes)

    async def run(self, item: Leased) -> Outcome:
        """Run one leased task in its own transaction: its outcome (see `AttemptRunner.run`)."""
        return await self.attempts.run(item)

    async def settle(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Write what `run`'s outcomes left to write (many in one transaction) and log each
        outcome's event; the outcomes as they ended (LeaseLost where the lease was lost)."""
        return await self.settler.settle(outcomes)

    async def keep_leases(self, stopping: asyncio.Event) -> None:
        """Renew the lease of every task this worker holds, every `lease / 3`, until
        stopping (beside `step`, for slow tasks)."""
        await self.upkeep.keep_leases(stopping)

    async def close(self) -> None:
        """Close the connections `run` and `step` took outside `consume` (which closes its
        own), and let the threads of sync tasks go."""
        await self.conns.close_pool()
        self.attempts.close()

    # -- shutdown -----------------------------------------------------------------------

    async def _finish(self) -> None:
        """At the end: settle the outcomes still pending, then hand back the tasks whose
        attempts were cancelled (their work rolled back) and those never started."""
        with contextlib.suppress(Exception):
            await self.settler.flush(once=True)
        # A count under way decides whether a handed-back task's attempt is undone.
        await asyncio.gather(*self.lanes.counting, return_exceptions=True)
        await self._hand_back_unstarted()
        await self._hand_back_cancelled()
        with contextlib.suppress(Exception):
            await self.conns.retire(self.id)
            if self.conns.notifies:
                await self.listener.say_roll_call()  # the others' turns close the gap at once

    async def _hand_back_unstarted(self) -> None:
        """Hand back the leased tasks that never started: available now, attempt uncounted."""
        ready = self.lanes.take_ready()
        if not ready:
            return
        try:
            await self.conns.hand_back_unstarted(ready)
        except OncelyError as exc:  # their leases run out instead; the rescuer hands them on
            logger.debug("could not hand back unstarted tasks: %s", exc)
            return
        for item in ready:
            self.leases.drop(item.id)

    async def _hand_back_cancelled(self) -> None:
        """Hand back the tasks of cancelled attempts (their work rolled back): available at
        once, the attempt not counted, recorded as cancelled by the shutdown."""
        held = self.leases.held
        if not held:
            return
        leftover = list(held.values())
        held.clear()
        try:
            handed = await self.conns.hand_back_cancelled(leftover)
        except Exception as exc:  # their leases run out instead; the rescuer hands them on
            events.emit(
                "worker.error",
                "could not hand back the cancelled tasks; they wait for their lease to run out",
                level=logging.ERROR,
                error=str(exc),
            )
            return
        self.handed_back += len(handed)
        for row in handed:
            events.emit(
                "task.cancelled",
                "cancelled by the shutdown; rolled back and handed back (attempt not counted)",
                level=logging.WARNING,
                task=row.task,
                id=row.id,
                attempt=row.attempt + 1,
            )
