"""The task worker: lease due tasks, run each in a transaction of its own, write outcomes.

One leaser takes due tasks in one statement (the attempt counts even if the worker dies) and
keeps up to `concurrency` of them running, plus a few leased ahead. Each task runs in its own
transaction on the worker's bounded pool (see store.task_store.TaskTransaction): it takes a
connection at its first statement, and its work and its ack commit together at its end. A
failure rolls back that task's transaction alone, so no other task's code runs again. Tasks
that made no statement, and failed tasks' retries and ends, are written by the settler, many
in one statement. Heartbeats renew every lease the worker holds in one statement; the rescuer
hands tasks whose lease ran out (their worker died) to whoever leases next. Postgres wakes an
idle worker with LISTEN/NOTIFY (trusted once a probe came back, kept up after a loss); an idle
worker that notifications wake sleeps until the next waiting task's time, looking every
LISTENING_POLL_S at most; without notifications it polls every `poll`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import functools
import itertools
import json
import logging
import time
import uuid
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from .. import clock, events, tracing
from ..errors import (
    DatabaseUnavailableError,
    JobTransactionError,
    OncelyError,
    TaskCancelledError,
)
from ..identity import replica_id
from ..model import UNRUNNABLE
from ..retry import DEFAULT_POLICY
from ..store import Fence, Leased, Settle, Store, TaskPool, violation
from ..tasks import Task, TaskRegistry, encode_result
from .options import WorkerOptions
from .outcome import (
    Discarded,
    LeaseLost,
    Outcome,
    Succeeded,
    decide,
    event,
    never_finished,
    settle,
    traced,
)
from .sync_task import run_sync_attempt

logger = logging.getLogger("oncely")

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
"""Seconds between two idle workers' turns at one notification (see `TaskWorker.notify`): longer
than the first one's lease and its word that it is answered take to reach the others (a few
milliseconds, more while twenty processes wake at once on two cores), so that the next one
looks only if the first did not take the task (no room, a failed lease, a dead worker)."""
TAKEN = "taken:"
"""The start of a notification's key that says which notifications are answered:
`taken:SCOPE:KEY,KEY,...`, SCOPE naming the queues and task names of the worker that says it
(a worker of other queues or names may have found nothing where this one would not)."""
ROLL_CALL = "workers"
"""A notification's key that says a worker started or stopped: every worker reads its place
among the live workers again at once (not at its next sign of life), so that the turns agree."""
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


class TaskWorker:
    """Runs the tasks of a registry from a store, as `options` say."""

    def __init__(self, store: Store, tasks: TaskRegistry, options: WorkerOptions) -> None:
        self.store = store
        self.tasks = tasks
        self.options = options
        self.by = replica_id()
        self.names = sorted(task.name for task in tasks)
        self._limited = any(
            task.limits.concurrency is not None or task.limits.rate is not None for task in tasks
        )
        """The task names this worker leases: the ones it registered (a task of a name it
        does not know waits for a worker that knows it, e.g. during a rolling deploy)."""
        self.held: dict[int, Leased] = {}
        """Leased tasks whose outcome is not written yet: what the heartbeat renews."""
        self.handed_back = 0
        """Tasks whose attempts the shutdown cancelled and handed back."""
        self._prefix = uuid.uuid4().hex[:16]
        self.id = f"{self.by}/{self._prefix}"
        """This worker, among the live ones (`oncely_workers`)."""
        self._counter = itertools.count()
        self._ready: collections.deque[Leased] = collections.deque()
        self._running: dict[int, asyncio.Task[None]] = {}
        self._counting: set[asyncio.Task[dict[int, int]]] = set()
        """Statements under way that count the attempts of leased-ahead tasks starting now."""
        self._renewed: dict[int, float] = {}
        """When (monotonic) the statement that last leased or renewed each held task was
        sent: its lease runs at least `lease` seconds from then."""
        self._stalled: set[int] = set()
        """Running tasks whose attempts a stall cancelled (their leases may have run out)."""
        self._ticked = time.monotonic()
        self._tick: asyncio.TimerHandle | None = None
        self._turned_away: dict[int, float] = {}
        """The last delay of each task this worker handed back as unrunnable."""
        self._settles: list[tuple[Outcome, Settle]] = []
        self._cancelling: set[int] = set()
        """Running tasks an operator cancelled: their attempts are being stopped."""
        self._spans: dict[tuple[int, str], tracing.Span] = {}
        """The spans of attempts whose outcome is not written yet, by (task id, lease token):
        a lease's tasks share its token (tracing)."""
        self._decided = 0
        """Held tasks whose outcome waits to be written: they free their room at once."""
        self._to_settle = asyncio.Event()
        self._room = asyncio.Event()
        self._woken = asyncio.Event()
        self.listening = False
        """Whether notifications wake this worker now (LISTEN up, and its probe came back)."""
        self._turns: dict[str, asyncio.TimerHandle] = {}
        """The notifications this worker waits for its turn at, by key."""
        self._answering: list[str] = []
        """The notifications this worker looks at first, not yet said to be answered."""
        scope = json.dumps([None if options.queues is None else sorted(options.queues), self.names])
        self._scope = f"{zlib.crc32(scope.encode()):08x}"
        """What this worker leases (its queues and task names), as a `taken` message names it."""
        self._turn = (0, 1)
        """(this worker's place among the live workers, how many they are): its turn at a
        notification, read after each sign of life."""
        self._roll_call = asyncio.Event()
        """Set when a worker started or stopped: `_announce` reads this one's place again."""
        self._news = 0
        """Counts what may have made a task due sooner: notifications, outcomes written."""
        self._looked: tuple[int, float] | None = None
        """(news, monotonic deadline) of the leaser's last `next_due`: its next look."""
        self._leased_at = time.monotonic()
        """When the leaser's last lease began (monotonic)."""
        self._listening_engine: AsyncEngine | None = None
        self._stopping = False
        self._crash: BaseException | None = None
        self._threads: ThreadPoolExecutor | None = None
        self.pool: TaskPool | None = None
        """The connections tasks' transactions take (while the worker runs)."""
        self.control: AsyncEngine = store.engine
        """Where the worker's own statements run: one connection, no transaction of theirs
        waiting on the disk (a lost lease or heartbeat is simply taken again)."""
        self.settling: AsyncEngine = store.engine
        """The control connection's engine, in transactions."""

    def token(self) -> str:
        """A lease token for one lease: unique to this worker and this lease."""
        return f"{self._prefix}.{next(self._counter)}"

    def notify(self, key: str | None = None) -> None:
        """New tasks may be due: the leaser looks at once (or as soon as it has room).

        A notification (its `key`, the same for every worker that hears it) is answered in
        turns: the live workers, in the order of their ids, take the key's hash as the
        first to look, the next one looks TURN_S later, and so on. An enqueued task then
        wakes one lease, not every idle worker's at once competing with the one that gets
        it. If that lease comes back short (it took every due task), its worker says so (a
        notification "taken:SCOPE:KEYS") and the turns of the workers of the same queues
        and task names (SCOPE) are cancelled; otherwise (it had no room, it failed, it
        died) they look at their turns and take the rest."""
        if key == ROLL_CALL:
            self._roll_call.set()  # a worker came or went: read this one's place again
            return
        if key is not None and key.startswith(TAKEN):
            scope, _, answered = key[len(TAKEN) :].partition(":")
            if scope != self._scope:
                return  # its lease did not look where this worker's would
            for one in answered.split(","):
                turn = self._turns.pop(one, None)
                if turn is not None:
                    turn.cancel()  # the first to look leased all that was due
            return
        wait = self._turn_wait(key) if key is not None else 0.0
        if key is not None and wait > 0:
            if key not in self._turns:
                loop = asyncio.get_running_loop()
                self._turns[key] = loop.call_later(wait, self._turn_come, key)
            return
        if key is not None and self._turn[1] > 1 and len(self._answering) < ANSWERS_AT_MOST:
            self._answering.append(key)  # ours to say "taken" of, after our next lease
        self._wake()  # (a worker alone has no one to say it to)

    def _turn_come(self, key: str) -> None:
        self._turns.pop(key, None)
        if len(self._answering) < ANSWERS_AT_MOST:
            self._answering.append(key)  # the first had no room, or failed: ours now
        self._wake()

    def _wake(self) -> None:
        self._news += 1
        self._woken.set()

    async def _say_taken(self, keys: list[str]) -> None:
        """After a lease that came back short: the notifications `keys`, which this worker
        looked at first, are answered (every due task is leased)."""
        try:
            await self._say(f"{TAKEN}{self._scope}:{','.join(keys)}")
        except OncelyError as exc:  # the others look at their turns instead
            logger.debug("saying the notifications were answered failed: %s", exc)

    async def _say(self, payload: str) -> None:
        """Send `payload` to every listening worker (on Postgres; elsewhere nothing)."""
        with self.store.translate():
            async with self.control.connect() as conn:
                await self.store.dialect.notify_workers(conn, payload)

    def _turn_wait(self, key: str) -> float:
        """Seconds this worker waits before it answers the notification `key`."""
        place, count = self._turn
        if count <= 1:
            return 0.0
        first = zlib.crc32(key.encode()) % count
        return ((place - first) % count) * TURN_S

    # -- running ------------------------------------------------------------------------

    async def consume(self, stopping: asyncio.Event) -> None:
        """Run until `stopping` is set and the tasks in flight end; cancelling the call rolls
        back the tasks still running and hands them back."""
        await self.store.ensure_schema()
        tracing.warm()  # before the first lease: not between a task's lease and its start
        pool, self.settling = self.store.worker_engines(self.options.pool_size)
        self.pool = pool
        self.control = self.store.dialect.autocommit(self.settling)
        listening = self._listening_engine = self.store.dedicated_engine()
        try:
            await self._serve(stopping)
        finally:
            self._listening_engine = None
            await pool.close()
            if self._threads is not None:
                self._threads.shutdown(wait=False)
                self._threads = None
            for engine in {pool.engine, self.settling, listening}:
                if engine is not self.store.engine:
                    await engine.dispose()
            self.pool = None
            self.control = self.settling = self.store.engine

    async def _serve(self, stopping: asyncio.Event) -> None:
        closing = asyncio.Event()  # the helpers end their loops (no statement cut short)
        helpers = [
            asyncio.create_task(self.keep_leases(closing)),
            asyncio.create_task(self._rescuer(closing)),
            asyncio.create_task(self._settler(closing)),
            asyncio.create_task(self._announce(closing)),
            asyncio.create_task(self._watch_cancels(closing)),
            asyncio.create_task(self._keep_listening(closing)),
        ]
        self._ticked = time.monotonic()
        self._tick = asyncio.get_running_loop().call_later(STALL_TICK_S, self._watch_clock)
        try:
            await self._lease(stopping)
            self._stopping = True
            await self._give_back_ready()
            while self._running:
                await asyncio.wait(list(self._running.values()))
            await self._flush()
            if self._crash is not None:
                raise self._crash
        finally:
            self._stopping = True
            if self._tick is not None:
                self._tick.cancel()
                self._tick = None
            for turn in self._turns.values():
                turn.cancel()
            self._turns.clear()
            running = list(self._running.values())
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            closing.set()
            _, late = await asyncio.wait(helpers, timeout=HELPERS_END_S)
            for helper in late:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await asyncio.shield(self._finish())

    async def _finish(self) -> None:
        """At the end: write the outcomes still pending, then hand back the tasks whose
        attempts were cancelled (their work rolled back) and those never started."""
        with contextlib.suppress(Exception):
            await self._flush(once=True)
        # A count under way decides whether a handed-back task's attempt is undone.
        await asyncio.gather(*self._counting, return_exceptions=True)
        await self._give_back_ready()
        await self._give_back()
        with contextlib.suppress(Exception):
            await self.store.tasks.retire(self.id, self.control)
            if self.store.dialect.notifies:
                await self._say(ROLL_CALL)  # the others' turns close the gap at once

    async def _lease(self, stopping: asyncio.Event) -> None:
        """Keep up to `concurrency` tasks running and `prefetch` more leased, until stopping."""
        options = self.options
        capacity = options.concurrency + options.prefetch
        low = max(1, capacity // 4)
        while not stopping.is_set() and self._crash is None:
            room = capacity - (len(self.held) - self._decided)  # decided: no longer in flight
            if room < low:
                self._room.clear()
                await _first(stopping, self._room)
                continue
            want = min(room, options.batch)
            # Cleared before the lease, not after: an outcome written or a task ended while
            # the lease runs (a retry it did not see) wakes the wait below.
            self._woken.clear()
            self._room.clear()
            answering, self._answering = self._answering, []
            self._leased_at = sent = time.monotonic()
            # The attempts of the tasks that start at once count with the lease; the others'
            # when their bodies start (a worker that dies before spends none of them).
            start = max(0, options.concurrency - len(self._running) - len(self._ready))
            fetched = await self._fetch(want, stopping, start)
            leased = fetched or []
            for item in leased:
                self.held[item.id] = item
                self._renewed[item.id] = sent
            runnable = self._runnable(leased)
            self._ready.extend(runnable)
            self._dispatch()
            if len(runnable) < len(leased):
                await self._turn_away([i for i in leased if i not in runnable])
            if answering and fetched is not None and len(leased) < want and self._crash is None:
                # The tasks start before the word goes out: they run up to their first
                # wait (a statement, a call) before the word's statement takes the loop.
                await asyncio.sleep(0)
                await self._say_taken(answering)  # a lease begun after those notifications
            if len(leased) < want:
                # Short: nothing more is due, or the rest waits for a limit's room, which a
                # task of this worker that ends may free: look again then, or when notified,
                # or when the next task comes due.
                wait = await self._next_look(stopping)
                await _first(stopping, self._woken, self._room, timeout=wait)

    async def _next_look(self, stopping: asyncio.Event) -> float:
        """Seconds until the leaser looks again unless woken: `poll` without notifications;
        with them, when the next task comes due (asked once per news), at most
        LISTENING_POLL_S, or `poll` while a limit holds back tasks that are due (its room
        frees without a notification)."""
        poll = self.options.poll
        if not self.listening:
            return poll
        news, now = self._news, time.monotonic()
        if self._looked is not None and self._looked[0] == news and self._looked[1] > now:
            return self._looked[1] - now
        await _first(stopping, self._woken, self._room, timeout=LOOK_AFTER_S)
        if stopping.is_set() or self._woken.is_set() or self._room.is_set():
            return 0.0  # woken meanwhile: lease again first
        news = self._news
        try:
            async with self.control.connect() as conn:
                # Since the last lease began (and LOOK_BACK_S before): a task that came
                # due after it looked (a retry this worker wrote meanwhile) is due now, and
                # leased at once.
                later, held = await self.store.tasks.next_due(
                    conn,
                    self.options.queues,
                    self.names,
                    held=self._limited,
                    since=time.monotonic() - self._leased_at + LOOK_BACK_S,
                )
        except OncelyError as exc:
            logger.debug("reading when the next task is due failed: %s", exc)
            return poll
        if later is not None and later <= 0 and self._turns:
            # Due already, while a notification waits for this worker's turn: most likely
            # the task it announced, so look at that turn, not before the first to look.
            loop = asyncio.get_running_loop()
            later = min(turn.when() for turn in self._turns.values()) - loop.time()
        wait = poll if held else LISTENING_POLL_S if later is None else later
        wait = max(0.0, min(wait, LISTENING_POLL_S))
        self._looked = (news, time.monotonic() + wait)
        return wait

    async def _keep_listening(self, closing: asyncio.Event) -> None:
        """Keep LISTEN up while the worker runs: after a failure or a lost connection, try
        again with backoff (the leaser polls every `poll` meanwhile); once it works again,
        look for tasks at once (some may have been enqueued while no one listened)."""
        engine = self._listening_engine or self.store.engine
        retry = LISTEN_RETRY_FIRST_S
        while not closing.is_set():
            lost = asyncio.Event()

            def on_lost(lost: asyncio.Event = lost) -> None:
                lost.set()
                self.listening = False
                self.notify()  # the leaser goes back to polling now

            try:
                # The probe goes out on the control connection: no third connection.
                listen = self.store.listen(
                    self.notify, engine=engine, on_lost=on_lost, prober=self.control
                )
                async with listen as works:
                    if works and not lost.is_set():
                        self.listening = True
                        retry = LISTEN_RETRY_FIRST_S
                        self.notify()
                        await _first(closing, lost)
            finally:
                self.listening = False
            if not self.store.dialect.notifies:
                return  # SQLite: polling is all there is
            await _first(closing, timeout=retry)
            retry = min(retry * 2, LISTEN_RETRY_MAX_S)

    async def _fetch(
        self, want: int, stopping: asyncio.Event, start: int | None = None
    ) -> list[Leased] | None:
        """Lease up to `want` due tasks (the attempts of the first `start` counted); None if
        the lease failed (after a pause)."""
        options = self.options
        # A lease of tasks with a concurrency or rate limit is several statements (and
        # transaction-scoped locks of their groups): it needs a transaction of its own.
        engine = self.settling if self._limited else self.control
        try:
            async with engine.connect() as conn:
                return await self.store.tasks.fetch(
                    conn,
                    options.queues,
                    want,
                    self.token(),
                    self.by,
                    options.lease,
                    self.names,
                    start,
                )
        except (DatabaseUnavailableError, OSError) as exc:
            events.emit(
                "worker.db_error",
                "database unavailable; retrying",
                level=logging.WARNING,
                error=str(exc),
            )
            await _first(stopping, timeout=1.0)
        except OncelyError as exc:
            if self.store.is_busy(exc):
                await _first(stopping, timeout=0.05)
            else:
                events.emit(
                    "worker.error", "leasing failed; retrying", level=logging.ERROR, error=str(exc)
                )
                await _first(stopping, timeout=1.0)
        return None

    def _dispatch(self) -> None:
        starting: list[Leased] = []
        room = self.options.concurrency - len(self._running)
        while self._ready and not self._stopping and len(starting) < room:
            starting.append(self._ready.popleft())
        uncounted = [item for item in starting if not item.counted]
        counting = None
        if uncounted:  # leased ahead: one statement counts their attempts before they start
            counting = asyncio.create_task(self._begin_attempts(uncounted))
            self._counting.add(counting)
            counting.add_done_callback(self._counting.discard)
        for item in starting:
            task = asyncio.create_task(self._attempt(item, None if item.counted else counting))
            self._running[item.id] = task
            task.add_done_callback(functools.partial(self._ended, item.id))

    async def _begin_attempts(self, items: list[Leased]) -> dict[int, int]:
        """Count the attempts of leased-ahead tasks whose bodies start now; {id: attempt} of
        those whose leases are still this worker's (the others are no longer its to run)."""
        try:
            counted = await self.store.tasks.begin_attempts(items, self.control)
        except OncelyError as exc:  # uncounted: their leases run out, the rescuer hands them on
            logger.debug("counting the attempts of starting tasks failed: %s", exc)
            counted = {}
        for item in items:
            if item.id in counted and item.id in self.held:
                self.held[item.id] = dataclasses.replace(
                    item, attempt=counted[item.id], counted=True
                )
        return counted

    # -- tasks this worker cannot run ---------------------------------------------------

    def _runnable(self, leased: list[Leased]) -> list[Leased]:
        """The leased tasks this worker can run: it registers their names and their
        arguments bind its functions (another release may have enqueued them)."""
        return [item for item in leased if self._cannot_run(item) is None]

    def _cannot_run(self, item: Leased) -> str | None:
        """Why this worker cannot run `item` (its error as handed back), or None."""
        task = self.tasks.find(item.task)
        if task is None:
            wants, detail = "registers it", f"no task {item.task!r} is registered"
        else:
            unbound = task.unbound(item.args)
            if unbound is None:
                return None
            wants, detail = unbound
        head = f"waiting for a worker whose `{item.task}` {wants}"
        if task is None:
            head = f"waiting for a worker that registers `{item.task}`"
        return f"{UNRUNNABLE}{head} ({self.id} cannot run it: {detail}; handed back uncounted)"

    async def _turn_away(self, items: list[Leased]) -> None:
        """Hand back tasks this worker cannot run, their attempts uncounted, due again after
        a delay that doubles each time this worker hands the same task back."""
        by_reason: dict[tuple[str, float], list[Leased]] = {}
        if len(self._turned_away) > TURNED_AWAY_AT_MOST:
            self._turned_away.clear()
        for item in items:
            last = self._turned_away.get(item.id)
            wait = UNRUNNABLE_WAIT_FIRST if last is None else min(2 * last, UNRUNNABLE_WAIT_MAX)
            self._turned_away[item.id] = wait
            by_reason.setdefault((self._cannot_run(item) or UNRUNNABLE, wait), []).append(item)
        for (reason, wait), group in by_reason.items():
            try:
                await self.store.tasks.turn_away(group, wait, reason, self.control)
            except OncelyError as exc:  # their leases run out; the rescuer hands them on
                logger.debug("handing back tasks this worker cannot run failed: %s", exc)
            for item in group:
                self.held.pop(item.id, None)
                events.emit(
                    "task.handed_back",
                    "this worker cannot run it (another release enqueued it); handed back, "
                    "attempt not counted",
                    level=logging.WARNING,
                    task=item.task,
                    id=item.id,
                    reason=reason.split(" (", 1)[0][len(UNRUNNABLE) :],
                    wait=wait,
                )

    # -- stalls ---------------------------------------------------------------------------

    def _watch_clock(self) -> None:
        """A plain callback of the event loop, every STALL_TICK_S: after a stall (STALL_S or
        more between two looks) it runs in the loop's first round, before the tasks that
        round wakes go on, and cancels the running attempts whose leases may have run out
        meanwhile (`lease` seconds since the statement that last renewed them was sent:
        another worker may run them now); their transactions roll back, they end as a lost
        lease."""
        now = time.monotonic()
        gap, self._ticked = now - self._ticked, now
        self._tick = asyncio.get_running_loop().call_later(STALL_TICK_S, self._watch_clock)
        if gap < STALL_S:
            return
        lease = self.options.lease
        late = [
            task_id
            for task_id in self._running
            if task_id not in self._stalled and now - self._renewed.get(task_id, now) >= lease
        ]
        for task_id in late:
            self._stalled.add(task_id)
            self._running[task_id].cancel()
        if late:
            events.emit(
                "worker.stalled",
                "this worker did not run for a while; the attempts whose leases may have run "
                "out were cancelled before they went on",
                level=logging.WARNING,
                seconds=round(gap, 3),
                cancelled=len(late),
            )

    def _ended(self, task_id: int, task: asyncio.Task[None]) -> None:
        if self._running.get(task_id) is task:
            del self._running[task_id]
        if not task.cancelled() and task.exception() is not None and self._crash is None:
            self._crash = task.exception()  # a BaseException the attempt let through
        self._room.set()
        self._dispatch()

    async def _attempt(
        self, item: Leased, counting: asyncio.Task[dict[int, int]] | None = None
    ) -> None:
        try:
            if counting is not None:
                counted = await asyncio.shield(counting)
                if item.id not in counted:  # the lease is no longer this worker's
                    self.held.pop(item.id, None)
                    self._emit(LeaseLost(item))
                    return
                item = dataclasses.replace(item, attempt=counted[item.id], counted=True)
            outcome = await self.run(item)
        except asyncio.CancelledError:
            if item.id in self._stalled:  # a stall past the lease: nothing committed
                self._stalled.discard(item.id)
                self._record(LeaseLost(item))
                return
            if item.id not in self._cancelling:
                raise  # the shutdown's: handed back
            self._cancelling.discard(item.id)  # an operator's: rolled back, discarded
            error = TaskCancelledError("an operator cancelled the task while it ran")
            self._record(Discarded(item, 0.0, error))
            return
        except Exception:
            raise
        except BaseException:
            # A simulated crash (the testing toolkit): the lease stays taken, as a killed
            # worker's would, until it runs out.
            self.held.pop(item.id, None)
            raise
        self._record(outcome)

    def _record(self, outcome: Outcome) -> None:
        pending = settle(outcome)
        if pending is None:
            self.held.pop(outcome.item.id, None)
            self._emit(outcome)
            return
        self._settles.append((outcome, pending))
        self._decided += 1
        self._to_settle.set()
        self._room.set()

    # -- one attempt --------------------------------------------------------------------

    def _pool(self) -> TaskPool:
        if self.pool is None:  # a step outside `consume`: the store's own engine
            store = self.store
            self.pool = TaskPool(
                store.dialect.task_engine(store.engine),
                self.options.pool_size,
                store.dialect.task_connection_ok,
            )
        return self.pool

    async def run(self, item: Leased) -> Outcome:
        """Run one leased task in its own transaction: its outcome (written already if its
        work committed with its ack; else see `outcome.settle`)."""
        span = tracing.task_attempt(item.task, item.id, item.attempt, item.queue, item.trace)
        if span is None:
            return await self._run(item)
        self._spans[item.id, item.token] = span  # ended with the outcome's event (`_emit`)
        try:
            with tracing.current(span):
                return await self._run(item)
        except BaseException as exc:  # cancelled (shutdown, operator) or a simulated crash
            del self._spans[item.id, item.token]
            stopped = "cancelled" if isinstance(exc, asyncio.CancelledError) else "crashed"
            with tracing.ended(span, stopped, exc):
                raise

    async def _run(self, item: Leased) -> Outcome:
        task = self.tasks.find(item.task)
        policy = task.retry if task is not None else DEFAULT_POLICY
        ended = never_finished(item, policy)
        if ended is not None:
            return ended
        events.emit(
            "task.started",
            "started",
            level=logging.DEBUG,
            task=item.task,
            id=item.id,
            attempt=item.attempt,
        )
        started = time.perf_counter()
        eager = False
        while True:
            tx = self.store.tasks.transaction(self._pool(), item, eager=eager)
            try:
                try:
                    if task is None:
                        raise LookupError(f"no task {item.task!r} is registered in this worker")
                    if task.is_async:
                        value = await _call(task, tx.session, item.args)
                        result = encode_result(value, task.name, task.limits.max_result)
                        committed = await tx.commit(result)
                    else:
                        committed, result = await self._in_thread(task, item, eager)
                finally:
                    await tx.close()
            except Exception as exc:
                if not eager and self.store.dialect.is_conflict(exc):
                    eager = True  # another writer, not the task: once more, lock first
                    events.emit(
                        "task.conflict",
                        "its transaction met another writer; rolled back, running it again",
                        level=logging.DEBUG,
                        task=item.task,
                        id=item.id,
                        attempt=item.attempt,
                    )
                    continue
                return decide(item, policy, exc, time.perf_counter() - started, clock.utcnow())
            duration = time.perf_counter() - started
            if committed is False:
                return LeaseLost(item)
            return Succeeded(item, duration, settled=committed is True, result=result)

    async def _in_thread(
        self, task: Task, item: Leased, eager: bool
    ) -> tuple[bool | None, str | None]:
        """Run a plain `def` task in the worker's thread pool, in its own transaction on a
        synchronous connection, so that it blocks no other task, heartbeat or slot. A timeout,
        a cancel or a shutdown gives the attempt up at once: the thread may run on (Python
        cannot stop it), but it never commits (its `Fence`)."""
        if self._threads is None:
            size = min(self.options.concurrency, self.options.pool_size)
            self._threads = ThreadPoolExecutor(size, thread_name_prefix="oncely-task")
        fence = Fence()
        call: Callable[[], tuple[bool | None, str | None]]
        hook = task.attempt
        encode = functools.partial(encode_result, task=task.name, limit=task.limits.max_result)
        if hook is not None:  # an integration's own transaction (Django's)
            stored: list[str | None] = [None]

            def ack(value: Any) -> tuple[Any, dict[str, Any]]:  # at the ack: SQLite's "now"
                stored[0] = encode(value)  # is the host's, read then
                return self.store.tasks.ack_one(item, stored[0])

            def call() -> tuple[bool | None, str | None]:
                return hook(item, ack, fence), stored[0]

        else:
            call = functools.partial(
                run_sync_attempt, self.store.tasks, task.func, item, fence, encode, eager=eager
            )
        future: asyncio.Future[tuple[bool | None, str | None]]
        in_context = functools.partial(contextvars.copy_context().run, call)  # the span's
        future = asyncio.get_running_loop().run_in_executor(self._threads, in_context)
        future.add_done_callback(_retrieved)
        try:
            if task.timeout is None:
                return await asyncio.shield(future)
            return await asyncio.wait_for(asyncio.shield(future), task.timeout)
        except BaseException:
            fence.close()  # it waits for a commit under way: then that commit stands
            if future.done() and not future.cancelled() and future.exception() is None:
                return future.result()
            raise

    async def step(self, limit: int | None = None) -> list[Outcome]:
        """Lease the due tasks once (at most `limit`), run them, write their outcomes; the
        outcomes, in lease order. The worker's one step, for tests and the testing toolkit
        (`keep_leases` renews the leases meanwhile, if the tasks are slow)."""
        options = self.options
        await self.store.ensure_schema()  # once: what the schema keeps (an error history)
        async with self.control.connect() as conn:
            leased = await self.store.tasks.fetch(
                conn,
                options.queues,
                limit or options.batch,
                self.token(),
                self.by,
                options.lease,
                self.names,
            )
        for item in leased:
            self.held[item.id] = item
        runnable = self._runnable(leased)
        if len(runnable) < len(leased):
            await self._turn_away([i for i in leased if i not in runnable])
            leased = runnable
        gate = asyncio.Semaphore(options.concurrency)

        async def bounded(item: Leased) -> Outcome:
            async with gate:
                return await self.run(item)

        temporary = self.pool is None
        try:
            outcomes = list(await asyncio.gather(*(bounded(item) for item in leased)))
        except BaseException:
            for item in leased:
                self.held.pop(item.id, None)
            raise
        finally:
            if temporary and self.pool is not None:
                await self.pool.close()
                self.pool = None
        return await self.settle(outcomes)

    async def close(self) -> None:
        """Close the connections `run` and `step` took outside `consume` (which closes its
        own), and let the threads of sync tasks go."""
        if self.pool is not None:
            await self.pool.close()
            self.pool = None
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None

    async def settle(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Write what `run`'s outcomes left to write (many in one transaction) and log each
        outcome's event; the outcomes as they ended (LeaseLost where the lease was lost)."""
        pending = [s for o in outcomes if (s := settle(o)) is not None]
        written = await self.store.tasks.settle(pending, self.control) if pending else set()
        final: list[Outcome] = []
        for outcome in outcomes:
            if settle(outcome) is not None and outcome.item.id not in written:
                outcome = LeaseLost(outcome.item)
            self.held.pop(outcome.item.id, None)
            self._emit(outcome)
            final.append(outcome)
        return final

    # -- outcomes, leases ---------------------------------------------------------------

    def _emit(self, outcome: Outcome) -> None:
        """Log an outcome once it is in the database, and end its attempt's span with it."""
        name, text, level, fields = event(outcome)
        span = self._spans.pop((outcome.item.id, outcome.item.token), None)
        with tracing.ended(span, *traced(outcome)):
            events.emit(name, text, level=level, **fields)

    async def _settler(self, closing: asyncio.Event) -> None:
        while not closing.is_set():
            await _first(closing, self._to_settle)
            self._to_settle.clear()
            await self._flush(closing)

    async def _flush(self, closing: asyncio.Event | None = None, *, once: bool = False) -> None:
        """Write the pending outcomes, many per statement; on a database error, keep them
        and try again (their leases stay renewed meanwhile) until `closing`."""
        while self._settles and not (closing is not None and closing.is_set()):
            batch, self._settles = self._settles, []
            try:
                written = await self.store.tasks.settle([s for _, s in batch], self.control)
            except OncelyError as exc:
                self._settles[:0] = batch
                if once:
                    raise
                if not self.store.is_busy(exc):
                    logger.debug("writing outcomes failed: %s", exc)
                await _first(
                    closing or asyncio.Event(), timeout=0.05 if self.store.is_busy(exc) else 1.0
                )
                continue
            for outcome, pending in batch:
                self.held.pop(pending.item.id, None)
                self._decided -= 1
                self._emit(outcome if pending.item.id in written else LeaseLost(pending.item))
            self._news += 1  # a retry written may come due before the next look
            self._room.set()

    async def _announce(self, stopping: asyncio.Event) -> None:
        """Say every ANNOUNCE_EVERY seconds that this worker lives and which task names it
        leases (what `oncely tasks` reads to name the tasks no live worker can run); where
        notifications wake workers, read its place among them after each sign of life, and
        at once whenever a worker says it started or stopped (its own first sign of life
        says so)."""
        first = True
        due = time.monotonic()
        notifies = self.store.dialect.notifies
        while not stopping.is_set():
            try:
                if time.monotonic() >= due:
                    due = time.monotonic() + ANNOUNCE_EVERY
                    await self.store.tasks.announce(self.id, self.names, self.control, first=first)
                    if first and notifies:
                        await self._say(ROLL_CALL)
                    first = False
                if notifies:
                    self._roll_call.clear()
                    self._turn = await self.store.tasks.turn(
                        self.id, 3 * ANNOUNCE_EVERY, self.control
                    )
            except OncelyError as exc:
                logger.debug("announcing the worker failed: %s", exc)
            wait = max(0.0, due - time.monotonic())
            await _first(stopping, self._roll_call, timeout=wait)

    async def keep_leases(self, stopping: asyncio.Event) -> None:
        """Renew the lease of every task this worker holds, every `lease / 3`, until
        stopping; a task missing from the answer has lost its lease (its ack will fail)."""
        interval = self.options.lease / 3
        while not stopping.is_set():
            await _first(stopping, timeout=interval)
            if self.pool is not None:
                await self.pool.trim(POOL_IDLE_S)
            for task_id in [i for i in self._renewed if i not in self.held]:
                del self._renewed[task_id]
            held = list(self.held.values())
            if not held:
                continue
            sent = time.monotonic()
            try:
                renewed = await self.store.tasks.heartbeat(held, self.options.lease, self.control)
            except OncelyError as exc:
                logger.debug("heartbeat failed: %s", exc)
                continue
            for task_id in renewed:
                if task_id in self._renewed:
                    self._renewed[task_id] = sent
            for item in held:
                if item.id not in renewed and item.id in self.held:
                    logger.debug("lease of task %s not renewed (busy or lost)", item.id)

    async def _watch_cancels(self, stopping: asyncio.Event) -> None:
        """Every CANCEL_CHECK_S while tasks run: stop those an operator asked to cancel
        (`oncely tasks cancel`): their transactions roll back and they end discarded."""
        while not stopping.is_set():
            await _first(stopping, timeout=CANCEL_CHECK_S)
            running = [i for i in self._running if i not in self._cancelling]
            if not running:
                continue
            try:
                asked = await self.store.control.cancel_requested(running, self.control)
            except OncelyError as exc:
                logger.debug("reading cancel requests failed: %s", exc)
                continue
            for task_id in asked:
                attempt = self._running.get(task_id)
                if attempt is not None:
                    self._cancelling.add(task_id)
                    attempt.cancel()

    async def _rescuer(self, stopping: asyncio.Event) -> None:
        interval = max(0.05, min(self.options.lease / 2, 10.0))
        while not stopping.is_set():
            try:
                for row in await self.store.tasks.rescue(engine=self.control):
                    events.emit(
                        "task.lease_expired",
                        "its worker stopped renewing the lease; available again",
                        level=logging.WARNING,
                        task=row.task,
                        id=row.id,
                        attempt=row.attempt,
                        locked_by=row.locked_by,
                    )
                    self.notify()
            except OncelyError as exc:
                logger.debug("rescue failed: %s", exc)
            await _first(stopping, timeout=interval)

    # -- shutdown -----------------------------------------------------------------------

    async def _give_back_ready(self) -> None:
        """Give back the leased tasks that never started: available now, attempt uncounted."""
        ready = list(self._ready)
        self._ready.clear()
        if not ready:
            return
        try:
            await self.store.tasks.give_back(ready, started=False, engine=self.control)
        except OncelyError as exc:  # their leases run out instead; the rescuer hands them on
            logger.debug("could not give back unstarted tasks: %s", exc)
            return
        for item in ready:
            self.held.pop(item.id, None)

    async def _give_back(self) -> None:
        """Hand back the tasks of cancelled attempts (their work rolled back): available at
        once, the attempt not counted, recorded as cancelled by the shutdown."""
        if not self.held:
            return
        leftover = list(self.held.values())
        self.held.clear()
        try:
            handed = await self.store.tasks.hand_back(leftover, self.control)
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


async def _first(
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


async def _call(task: Task, session: AsyncSession, args: dict[str, Any]) -> Any:
    call = task.func(session, **args)
    if task.timeout is not None:
        value = await asyncio.wait_for(call, task.timeout)
    else:
        value = await call
    what = violation(session.sync_session)
    if what is not None:
        raise JobTransactionError(f"the task called {what}() on oncely's session")
    return value


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A sync task's thread ended after its attempt was given up: its result is nobody's."""
    if not future.cancelled():
        future.exception()
