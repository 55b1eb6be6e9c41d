"""Attempt connections kept checked out between attempts, on an engine oncely built itself.

Checking a connection out of SQLAlchemy's pool and back in (the Connection object, its
isolation characteristic set and reset, the pool's events and reset) costs about 100 µs of CPU,
a third of a whole attempt on asyncpg. So the connection of an attempt whose transaction ended
cleanly is kept for the next attempt on the same event loop, up to `HOLD_AT_MOST` of them.
Before reuse the dialect checks a held connection as the pool would check an idle one (on
Postgres: a ping after two idle seconds); one that fails, or belongs to another event loop, is
discarded and the pool supplies a new one. A user's engine is never held from: its
connections stay in its own pool. An attempt's session refuses any use once its attempt has
ended (`session.end`), so a job that let its session outlive it cannot reach a connection
that has moved on; a job that takes the connection itself out of the session
(`await db.connection()`) and keeps it must not use it after returning either.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

HOLD_AT_MOST = 2
"""Connections kept between attempts: enough for a loop of attempts and a little overlap,
few enough that the pool keeps its other connections for everything else."""

Check = Callable[[AsyncConnection, float], Awaitable[bool]]
"""`check(conn, idle_seconds)`: whether a held connection is still good to use."""


@dataclass
class _Held:
    conn: AsyncConnection
    loop: asyncio.AbstractEventLoop
    since: float


class HeldConnections:
    """A LIFO of clean attempt connections, each with the event loop it belongs to.

    An app may run attempts on several loops at once (a thread with a loop of its own, as
    `oncely.testing` does when a loop is already running): a connection is only ever used,
    closed or discarded from its own loop, except once that loop is closed.
    """

    def __init__(self, limit: int = HOLD_AT_MOST) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._held: list[_Held] = []
        # An app dropped (or a script ended) without closing it: let go of what is held
        # without I/O, as the pool lets go of the connections it keeps.
        weakref.finalize(self, _abandon, self._held)

    async def take(self, check: Check) -> AsyncConnection | None:
        """The newest usable held connection of this loop, or None: check one out."""
        loop = asyncio.get_running_loop()
        while (held := self._pop(loop)) is not None:
            try:
                usable = await check(held.conn, time.monotonic() - held.since)
            except BaseException:
                _let_go(held.conn)
                raise
            if usable:
                return held.conn
            _let_go(held.conn)
        return None

    def _pop(self, loop: asyncio.AbstractEventLoop) -> _Held | None:
        """The newest connection of `loop`; those of closed loops are let go on the way."""
        with self._lock:
            for i in reversed(range(len(self._held))):
                held = self._held[i]
                if held.loop is loop:
                    del self._held[i]
                    return held
                if held.loop.is_closed():
                    del self._held[i]
                    _let_go(held.conn)
        return None

    def keep(self, conn: AsyncConnection) -> bool:
        """Hold a connection whose attempt ended cleanly; False if enough are held already."""
        with self._lock:
            if len(self._held) >= self._limit:
                return False
            self._held.append(_Held(conn, asyncio.get_running_loop(), time.monotonic()))
        return True

    async def close(self) -> None:
        """Give every held connection back, each on its own loop (one of a closed loop is let
        go of; one of a loop running in another thread is closed there, without waiting)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            held = list(self._held)
            self._held.clear()
        for one in held:
            if one.loop is loop:
                with contextlib.suppress(Exception):
                    await one.conn.close()
            elif one.loop.is_closed():
                _let_go(one.conn)
            else:
                with contextlib.suppress(RuntimeError):
                    asyncio.run_coroutine_threadsafe(one.conn.close(), one.loop)


def _let_go(conn: AsyncConnection) -> None:
    """Close a connection's socket and hand its pool slot back, without I/O to wait for.

    The driver is closed by hand first: on a connection of a closed event loop that fails
    half-way yet leaves the driver closed, so the pool's invalidation has nothing left to
    fail on, and an invalidated connection goes back to the pool without a reset.
    """
    with contextlib.suppress(Exception):
        conn.sync_connection.connection.driver_connection.terminate()  # type: ignore[union-attr]
    with contextlib.suppress(Exception):
        conn.sync_connection.invalidate()  # type: ignore[union-attr]
        conn.sync_connection.close()  # type: ignore[union-attr]


def _abandon(held: list[_Held]) -> None:
    """Let go of every held connection (an app dropped, or a script ended, unclosed)."""
    for one in held:
        _let_go(one.conn)
    held.clear()
