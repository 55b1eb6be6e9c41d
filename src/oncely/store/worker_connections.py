"""The task worker's one door to the store: its connections and the statements its parts send.

`Store.worker_connections()` hands a worker one of these. It holds the worker's three kinds
of connection: the control connection (the worker's own statements, one at a time, never
waiting behind tasks: leases, outcomes, heartbeats, rescues), the pool that tasks'
transactions take a connection from at their first statement, and the connection LISTEN
keeps. The worker's parts call its narrow methods; none of them touches the store's engine
or dialect, and the worker runs its users' code itself (work/sync_task.py), not here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from .control import Control
from .database import Database
from .session import violation
from .task_connections import TaskPool
from .task_group import TaskGroup
from .task_queue import Fence, Leased, Settle, TaskQueue, TaskTransaction


class WorkerConnections:
    """The connections a task worker uses and the statements it sends on them.

    Until `open` (and after `close`), every statement goes on the store's own engine: a
    worker that only `step`s (the testing toolkit) opens nothing of its own but the pool."""

    def __init__(self, db: Database, tasks: TaskQueue, control: Control) -> None:
        self._db = db
        self._tasks = tasks
        self._operators = control
        """The control plane's statements (an operator's cancel requests)."""
        self._control: AsyncEngine = db.engine
        """Where the worker's own statements run: one connection, no transaction of theirs
        waiting on the disk (a lost lease or heartbeat is simply taken again)."""
        self._in_transactions: AsyncEngine = db.engine
        """The control connection's engine, in transactions."""
        self._listening: AsyncEngine = db.engine
        self._pool: TaskPool | None = None
        """The connections tasks' transactions take."""

    # -- the connections ------------------------------------------------------------------

    async def ensure_schema(self) -> None:
        """Raise unless the database's schema is one this oncely runs on (checked once)."""
        await self._db.ensure_schema()

    def open(self, pool_size: int) -> None:
        """The worker starts: its own pool of `pool_size`, control and LISTEN connections."""
        db = self._db
        self._pool, self._in_transactions = db.worker_engines(pool_size)
        self._control = db.dialect.autocommit(self._in_transactions)
        self._listening = db.dedicated_engine()

    async def close_pool(self) -> None:
        """Close the pool's connections (a new pool is made at the next attempt)."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def close(self) -> None:
        """The worker stopped: close what `open` made; the store's engine serves again."""
        pool = self._pool
        await self.close_pool()
        own = self._db.engine
        engines = {self._in_transactions, self._listening} | ({pool.engine} if pool else set())
        for engine in engines:
            if engine is not own:
                await engine.dispose()
        self._control = self._in_transactions = self._listening = own

    @property
    def pool(self) -> TaskPool | None:
        """The pool tasks' transactions take their connections from, while it is open (by
        `open`, or by an attempt outside it)."""
        return self._pool

    def _task_pool(self, size: int) -> TaskPool:
        if self._pool is None:  # a step outside `consume`: the store's own engine
            dialect = self._db.dialect
            engine = dialect.task_engine(self._db.engine)
            self._pool = TaskPool(engine, size, dialect.task_connection_ok)
        return self._pool

    async def trim_pool(self, idle_s: float) -> None:
        """Close the pool's connections idle for `idle_s` seconds or more."""
        if self._pool is not None:
            await self._pool.trim(idle_s)

    # -- what the database is -------------------------------------------------------------

    @property
    def notifies(self) -> bool:
        """Whether the database wakes workers with notifications (Postgres)."""
        return self._db.dialect.notifies

    def is_busy(self, exc: BaseException) -> bool:
        """Whether a statement failed on another transaction's lock (worth a retry soon)."""
        return self._db.is_busy(exc)

    def is_unavailable(self, exc: BaseException) -> bool:
        """Whether an error means the database cannot be reached now (down, restarting,
        starting up, a connection it ended): an outage to wait out, not a failure."""
        return self._db.is_unavailable(exc)

    def is_conflict(self, exc: BaseException) -> bool:
        """Whether a task's transaction failed on another writer, not on the task's code."""
        return self._db.dialect.is_conflict(exc)

    # -- leasing --------------------------------------------------------------------------

    async def lease(
        self,
        queues: Sequence[str] | None,
        limit: int,
        token: str,
        by: str,
        lease: float,
        names: Sequence[str],
        start: int | None = None,
        *,
        limited: bool = False,
    ) -> list[Leased]:
        """Lease up to `limit` due tasks under `token` (the attempts of the first `start`
        counted). A lease of tasks with a concurrency or rate limit (`limited`) is several
        statements (and transaction-scoped locks of their groups): a transaction of its own."""
        engine = self._in_transactions if limited else self._control
        with self._db.translate():  # its connect too: a server starting up refuses it
            async with engine.connect() as conn:
                return await self._tasks.fetch(conn, queues, limit, token, by, lease, names, start)

    async def next_due(
        self, queues: Sequence[str] | None, names: Sequence[str], *, held: bool, since: float
    ) -> tuple[float | None, bool]:
        """Seconds until the next waiting task comes due (see TaskQueue.next_due)."""
        with self._db.translate():
            async with self._control.connect() as conn:
                return await self._tasks.next_due(conn, queues, names, held=held, since=since)

    async def begin_attempts(self, items: Sequence[Leased]) -> dict[int, int]:
        """Count the attempts of leased-ahead tasks whose bodies start now; {id: attempt} of
        those whose leases are still this worker's."""
        return await self._tasks.begin_attempts(items, self._control)

    # -- one attempt ----------------------------------------------------------------------

    def transaction(self, item: Leased, pool_size: int, *, eager: bool) -> TaskTransaction:
        """The transaction of one async attempt, on a connection of the pool."""
        return self._tasks.transaction(self._task_pool(pool_size), item, eager=eager)

    def can_group(self, pool_size: int) -> bool:
        """Whether tasks can run in groups on this store's pool (Postgres on asyncpg)."""
        return self._db.dialect.can_group(self._task_pool(pool_size).engine)

    def group(self, pool_size: int) -> TaskGroup:
        """The transaction of a group of async tasks, a savepoint each, on a connection of
        the pool (see store/task_group.py)."""
        return TaskGroup(self._tasks, self._task_pool(pool_size))

    def sync_session(self, *, eager: bool) -> tuple[Session, list[bool]]:
        """A sync session for one plain `def` task's transaction, and a list that gets an
        entry when it begins one (see TaskQueue.sync_session)."""
        return self._tasks.sync_session(eager=eager)

    def commit_sync(
        self, session: Session, touched: list[bool], item: Leased, fence: Fence, result: str | None
    ) -> bool | None:
        """Commit a plain `def` task's work with its ack (see TaskQueue.commit_sync)."""
        return self._tasks.commit_sync(session, touched, item, fence, result)

    def close_sync(self, session: Session) -> None:
        """Close a plain `def` task's session, rolling back what it left open."""
        self._tasks.close_sync(session)

    def ack_one(self, item: Leased, result: str | None) -> tuple[Any, dict[str, Any]]:
        """The ack of one task (a statement and its parameters), for an integration's own
        transaction (Django's) to run."""
        return self._tasks.ack_one(item, result)

    @staticmethod
    def violation(session: Session) -> str | None:
        """What a task tried to do to oncely's session (`commit`, ...), or None."""
        what = violation(session)
        return None if what is None else str(what)

    # -- outcomes, leases -----------------------------------------------------------------

    async def settle(self, pending: Sequence[Settle]) -> set[int]:
        """Write outcomes, many per statement; the ids written (a missing one lost its lease)."""
        return await self._tasks.settle(pending, self._control)

    async def heartbeat(self, held: Sequence[Leased], lease: float) -> set[int]:
        """Renew the leases of `held` for `lease` seconds; the ids renewed."""
        return await self._tasks.heartbeat(held, lease, self._control)

    async def rescue(self) -> list[Any]:
        """Make the tasks whose lease ran out available again; their rows."""
        return await self._tasks.rescue(engine=self._control)

    async def cancel_requested(self, ids: Sequence[int]) -> set[int]:
        """Which of these running tasks an operator asked to cancel."""
        return await self._operators.cancel_requested(ids, self._control)

    async def hand_back_unstarted(self, items: Sequence[Leased]) -> None:
        """Hand back leased tasks that never started: available now, attempt uncounted."""
        await self._tasks.hand_back_unstarted(items, started=False, engine=self._control)

    async def hand_back_cancelled(self, items: Sequence[Leased]) -> list[Any]:
        """Hand back the tasks of attempts a shutdown cancelled (rolled back): available now,
        recorded as cancelled; (id, task, attempt) of each."""
        return await self._tasks.hand_back_cancelled(items, self._control)

    async def hand_back_unrunnable(
        self, items: Sequence[Leased], wait: float, reason: str
    ) -> set[int]:
        """Hand back tasks this worker cannot run: due again in `wait` seconds, attempt
        uncounted, `reason` as their error; the ids handed back."""
        return await self._tasks.hand_back_unrunnable(items, wait, reason, self._control)

    # -- live workers, notifications --------------------------------------------------------

    async def announce(self, worker_id: str, names: Sequence[str], *, first: bool) -> None:
        """Say that this worker lives and which task names it leases."""
        await self._tasks.announce(worker_id, names, self._control, first=first)

    async def place(self, worker_id: str, within: float) -> tuple[int, int]:
        """(this worker's place among the workers seen within `within` seconds, how many)."""
        return await self._tasks.turn(worker_id, within, self._control)

    async def retire(self, worker_id: str) -> None:
        """Say that this worker stopped."""
        await self._tasks.retire(worker_id, self._control)

    async def say(self, payload: str) -> None:
        """Send `payload` to every listening worker (on Postgres; elsewhere nothing)."""
        with self._db.translate():
            async with self._control.connect() as conn:
                await self._db.dialect.notify_workers(conn, payload)

    def listen(
        self,
        on_notify: Callable[[str], None],
        on_lost: Callable[[], None],
        on_refused: Callable[[BaseException], None] | None = None,
    ) -> contextlib.AbstractAsyncContextManager[bool]:
        """LISTEN on the worker's own connection while the context is open; yields whether
        notifications work (a probe, sent on the control connection: no third connection,
        came back); `on_refused(error)` if that connection could not be opened."""
        return self._db.dialect.listener(
            self._listening, on_notify, on_lost, self._control, on_refused
        )
