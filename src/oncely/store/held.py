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
    """A LIFO of clean attempt connections, each with the event loop it belongs to."""

    def __init__(self, limit: int = HOLD_AT_MOST) -> None:
        self._limit = limit
        self._held: list[_Held] = []
        # An app dropped (or a script ended) without closing it: let go of what is held
        # without I/O, as the pool lets go of the connections it keeps.
        weakref.finalize(self, _abandon, self._held)

    def __len__(self) -> int:
        return len(self._held)

    async def take(self, check: Check) -> AsyncConnection | None:
        """The newest usable held connection, or None: check one out of the pool."""
        loop = asyncio.get_running_loop()
        while self._held:
            held = self._held.pop()
            try:
                usable = held.loop is loop and await check(held.conn, time.monotonic() - held.since)
            except BaseException:
                await _discard(held.conn)
                raise
            if usable:
                return held.conn
            await _discard(held.conn)
        return None

    def keep(self, conn: AsyncConnection) -> bool:
        """Hold a connection whose attempt ended cleanly; False if enough are held already."""
        if len(self._held) >= self._limit:
            return False
        self._held.append(_Held(conn, asyncio.get_running_loop(), time.monotonic()))
        return True

    async def close(self) -> None:
        """Give every held connection back (a connection of another loop is discarded)."""
        loop = asyncio.get_running_loop()
        held = list(self._held)
        self._held.clear()
        for one in held:
            if one.loop is loop:
                with contextlib.suppress(Exception):
                    await one.conn.close()
            else:
                await _discard(one.conn)


def _terminate(conn: AsyncConnection) -> None:
    """Close the driver's socket by hand: on a connection of a closed event loop this fails
    half-way yet leaves the driver closed, so the pool's own close has nothing left to fail on."""
    with contextlib.suppress(Exception):
        conn.sync_connection.connection.driver_connection.terminate()  # type: ignore[union-attr]


async def _discard(conn: AsyncConnection) -> None:
    """Close a connection's socket and hand its pool slot back without using it again."""
    _terminate(conn)
    with contextlib.suppress(Exception):
        await conn.invalidate()
    with contextlib.suppress(Exception):
        await conn.close()


def _abandon(held: list[_Held]) -> None:
    """`_discard` without an event loop: nothing left to wait for once the driver is closed."""
    for one in held:
        _terminate(one.conn)
        with contextlib.suppress(Exception):
            one.conn.sync_connection.invalidate()  # type: ignore[union-attr]
            one.conn.sync_connection.close()  # type: ignore[union-attr]
    held.clear()
