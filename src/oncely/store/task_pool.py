"""A task worker's pool: at most `size` connections, each lent to one task's transaction.

A task takes a connection at its first statement and gives it back when its transaction
ends, so the connections in use are the tasks inside a transaction right now. The pool keeps
its connections open between tasks (SQLAlchemy's own checkout and check-in, with its events
and reset, cost more CPU than the rest of a one-row task's transaction) and checks one that
was idle before lending it, as `held` does for attempts (on Postgres: a ping after two idle
seconds). A connection that comes back unclean (a transaction still open, a broken socket)
is closed, and the next task gets a new one.
"""

from __future__ import annotations

import asyncio
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
        self._free = asyncio.Semaphore(size)
        self._idle: list[tuple[AsyncConnection, float]] = []
        self.lent = 0
        """Connections lent to tasks right now."""
        self.peak = 0
        """The most connections lent at once."""

    async def take(self) -> AsyncConnection:
        """A connection for one task's transaction; waits while all `size` are lent."""
        await self._free.acquire()
        try:
            conn = await self._reuse() or await self.engine.connect()
        except BaseException:
            self._free.release()
            raise
        self.lent += 1
        self.peak = max(self.peak, self.lent)
        return conn

    async def _reuse(self) -> AsyncConnection | None:
        while self._idle:
            conn, since = self._idle.pop()
            if await self._check(conn, time.monotonic() - since):
                return conn
            await _close(conn)
        return None

    async def give(self, conn: AsyncConnection) -> None:
        """Take a connection back after its task's transaction ended (committed or not)."""
        self.lent -= 1
        try:
            if self._keep and await self._check(conn, 0.0):
                self._idle.append((conn, time.monotonic()))
            else:
                await _close(conn)
        finally:
            self._free.release()

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
        """Close the idle connections (those still lent close when given back)."""
        idle, self._idle = self._idle, []
        for conn, _since in idle:
            await _close(conn)


async def _close(conn: AsyncConnection) -> None:
    with contextlib.suppress(Exception):
        await conn.close()
