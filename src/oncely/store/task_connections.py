"""A task worker's pool: at most `size` connections, each lent to one task's transaction.

A task takes a connection at its first statement and returns it when its transaction
ends, so the connections in use are the tasks inside a transaction right now. The pool keeps
its connections open between tasks (SQLAlchemy's own checkout and check-in, with its events
and reset, cost more CPU than the rest of a one-row task's transaction) and checks one that
was idle before lending it, as `held` does for attempts (on Postgres: a ping after two idle
seconds). A connection that comes back unclean (a transaction still open, a broken socket)
is closed, and the next task gets a new one.

When every connection is lent, tasks wait in line for one, first come first served. A task
that commits while another waits may begin the waiter's transaction in the message of its
own COMMIT and hand its connection over at once (`hand_off`): the waiter is inside its first
statement, so its transaction still begins there, one round trip sooner, and no connection
ever sits idle in a transaction.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

Check = Callable[[AsyncConnection, float], Awaitable[bool]]
"""`check(conn, idle_seconds)`: whether a connection kept idle is still good to lend."""


class TaskPool:
    """Connections of `engine`, at most `size` lent at once."""

    def __init__(self, engine: AsyncEngine, size: int, check: Check, *, keep: bool = True) -> None:
        self.engine = engine
        self.size = size
        self._check = check
        self._keep = keep
        """Keep connections open between tasks (an engine of oncely's own); False: give each
        back to the engine's pool when its task ends (a user's engine, whose pool serves
        the app's requests too)."""
        self._idle: list[tuple[AsyncConnection, float]] = []
        self._waiters: collections.deque[asyncio.Future[AsyncConnection | None]] = (
            collections.deque()
        )
        """Tasks waiting for a connection, in order: each gets a free place (None: it opens
        or reuses a connection itself) or a connection handed over in a begun transaction."""
        self._closing: set[asyncio.Task[None]] = set()
        self.lent = 0
        """Connections lent to tasks right now (places taken, counting those being opened)."""
        self.peak = 0
        """The most connections lent at once."""

    @property
    def in_line(self) -> int:
        """Tasks waiting for a connection right now."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    @property
    def waiting(self) -> bool:
        """Whether a task waits for a connection (so one handed over would be taken at once);
        only for a pool that keeps its connections (a user's engine gets each one back)."""
        return self._keep and any(not waiter.done() for waiter in self._waiters)

    async def take(self) -> tuple[AsyncConnection, bool]:
        """A connection for one task's transaction, and whether that transaction is begun
        already (handed over by `hand_off`); waits, in line, while all `size` are lent."""
        if self.lent < self.size and not self._waiters:
            self.lent += 1
            self.peak = max(self.peak, self.lent)
            return await self._open(), False
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            handed = await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            else:  # given a place or a connection just as it was cancelled: pass it on
                self._pass_on(waiter.result())
            raise
        if handed is None:
            return await self._open(), False
        return handed, True

    async def _open(self) -> AsyncConnection:
        """A connection for a place just taken: a kept one still good, or a new one."""
        try:
            return await self._reuse() or await self.engine.connect()
        except BaseException:
            self._free_place()
            raise

    async def _reuse(self) -> AsyncConnection | None:
        while self._idle:
            conn, since = self._idle.pop()
            if await self._check(conn, time.monotonic() - since):
                return conn
            await _close(conn)
        return None

    def _free_place(self) -> None:
        """A place is free: to the first task in line, or back to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.lent -= 1

    def _pass_on(self, handed: AsyncConnection | None) -> None:
        """What a cancelled waiter was given: a place to the next one, a begun connection
        to the next one or, with no one left in line, closed (its transaction with it)."""
        if handed is None:
            self._free_place()
        elif not self.hand_off(handed):
            self._free_place()
            closing = asyncio.get_running_loop().create_task(_close(handed))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def hand_off(self, conn: AsyncConnection) -> bool:
        """Give `conn`, in a transaction begun for the next task, to the first task in line
        (its place goes with it); False if none waits any more (the caller ends that
        transaction and gives the connection back)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    async def give(self, conn: AsyncConnection) -> None:
        """Take a connection back after its task's transaction ended (committed or not)."""
        try:
            if self._keep and await self._check(conn, 0.0):
                self._idle.append((conn, time.monotonic()))
            else:
                await _close(conn)
        finally:
            self._free_place()

    async def trim(self, idle_s: float) -> int:
        """Close the connections idle for more than `idle_s` seconds (a burst is over: the
        worker keeps no more connections than its tasks use); how many were closed."""
        now = time.monotonic()
        stale = [(c, t) for c, t in self._idle if now - t > idle_s]
        self._idle = [(c, t) for c, t in self._idle if now - t <= idle_s]
        for conn, _since in stale:
            await _close(conn)
        return len(stale)

    async def close(self) -> None:
        """Close the idle connections (those still lent close when returned)."""
        idle, self._idle = self._idle, []
        for conn, _since in idle:
            await _close(conn)


async def _close(conn: AsyncConnection) -> None:
    with contextlib.suppress(Exception):
        await conn.close()
