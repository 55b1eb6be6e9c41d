"""A group of tasks in one transaction, a savepoint each (`WorkerOptions.group`, Postgres).

A worker with a backlog may run several short async tasks one after another on one
connection of its pool, in one durable transaction: each task's statements and its ack run
inside a savepoint of their own, a task that raises or lost its lease is rolled back to its
savepoint (its failure is then written in the same transaction), and one COMMIT lands every
task's work with its ack. Nothing of the group is in the database before that COMMIT: a worker
that dies mid-group leaves every task of it leased, to run again when the lease runs out; a
COMMIT that fails lands none of them, and the worker runs each again on its own. The round
trips per task that writes one row: its statement and its ack (which releases its savepoint
and takes the next in the same message); the BEGIN and the COMMIT are the group's. The group
takes its connection and begins at the first statement of any of its tasks: a group whose
tasks make none takes no connection and sends nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.util import await_only

from .. import hooks
from .session import end, set_driver_lender, take_over
from .task_connections import TaskPool
from .task_queue import _TX, Leased, Settle, TaskQueue, TaskSession, ready_to_ack


class TaskGroup:
    """The transaction of a group of tasks, on one connection of the worker's pool."""

    def __init__(self, tasks: TaskQueue, pool: TaskPool) -> None:
        self.tasks = tasks
        self.pool = pool
        self.dialect = tasks.dialect
        self._conn: AsyncConnection | None = None
        self._driver: Any = None
        self._next_begun = False
        self._beginning: asyncio.Lock | None = None

    async def begin(self) -> AsyncConnection:
        """The group's connection: at the first call, take one of the pool (waiting in line
        for it), begin the group's transaction on it and take the first savepoint. Calls made
        at once (a task asking twice concurrently) share the one connection."""
        if self._conn is None:
            if self._beginning is None:
                self._beginning = asyncio.Lock()
            async with self._beginning:
                if self._conn is None:
                    conn, begun = await self.pool.take()
                    self._conn = conn
                    with self.tasks.db.translate():
                        self._driver = await self.dialect.begin_group(conn, begun=begun)
        return self._conn

    def member(self, item: Leased) -> GroupMember:
        """The next task of the group: its session runs inside the group's transaction."""
        return GroupMember(self, item)

    async def record(self, settle: Settle) -> bool:
        """Write a failed task's retry or end in the group's transaction (its work was rolled
        back to its savepoint), iff its lease is still ours; then the next task's savepoint."""
        assert self._conn is not None
        with self.tasks.db.translate():
            written = await self.tasks._record_outcomes(self._conn, [settle])
            await self._conn.rollback()  # SQLAlchemy's own: sends nothing in autocommit
            await self.dialect.next_in_group(self._driver)
        return settle.item.id in written

    async def commit(self) -> None:
        """Commit every task's work and ack, and the failures written, at once (raises an
        OncelyError, nothing of the group committed, if the COMMIT fails); nothing to send if
        no task of the group made a statement."""
        if self._conn is None:
            return
        begin_next = self.pool.waiting
        with self.tasks.db.translate():
            await self.dialect.commit_group(self._driver, begin_next=begin_next)
        self._next_begun = begin_next and self._driver.is_in_transaction()

    async def close(self) -> None:
        """Roll back what did not commit and give the connection back (or hand it, in a
        transaction begun for it, to a task waiting for one)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._next_begun and self.pool.hand_off(conn):
            return
        if self._driver is not None:
            with contextlib.suppress(Exception):  # a broken connection: the pool closes it
                await self.dialect.rollback_task(self._driver)
        await self.pool.give(conn)


class GroupMember:
    """One task of a group: its session, and its ack or undo inside its savepoint."""

    def __init__(self, group: TaskGroup, item: Leased) -> None:
        self.group = group
        self.pool = group.pool  # what `task_queue._bound` reads of a task's session
        self.item = item
        self.touched = False
        """The task made a statement (inside its savepoint)."""
        self.opened = False
        """SQLAlchemy's session began (on the group's connection): it has a transaction of
        its own to end at `close`, where one taken on the driver alone has none."""
        self.session = AsyncSession(
            bind=group.pool.engine, sync_session_class=TaskSession, expire_on_commit=False
        )
        self.session.sync_session.info[_TX] = self
        set_driver_lender(self.session.sync_session, self.lend)

    def connection(self) -> Connection:
        """The group's connection, begun at the first statement of any of its tasks (the
        task's session asks at its first statement, in its greenlet, where the pool can be
        awaited)."""
        sync = await_only(self.group.begin()).sync_connection
        assert sync is not None
        return sync

    async def lend(self) -> Any:
        """The group's driver connection, inside the task's savepoint, for the task that asks
        for it (`asyncpg_connection`): the group begun at its first statement, as `connection`
        does, without the session beginning."""
        await self.group.begin()
        self.touched = True
        return self.group._driver

    def began(self, connection: Connection) -> None:
        """The session began: its statements run inside the task's savepoint."""
        self.touched = True
        self.opened = True

    async def ack(self, result: str | None = None) -> bool | None:
        """Flush what the task left pending, then ack it inside its savepoint: True; False if
        its lease was lost (rolled back to its savepoint); None if it made no statement (its
        ack is a `Settle` for the worker to write)."""
        if not await ready_to_ack(self):
            return None
        session, group, item = self.session, self.group, self.item
        tasks = group.tasks
        with tasks.db.translate():
            hooks.before_commit(item.task, str(item.id))
            if result is None:
                return await group.dialect.ack_in_group(
                    group._driver, item.id, item.token, function=tasks.db.has_ack_function
                )
            if (await session.execute(*tasks.ack_one(item, result))).first() is None:
                await group.dialect.undo_in_group(group._driver)
                return False
            await group.dialect.next_in_group(group._driver)
            return True

    async def undo(self) -> None:
        """The task raised: roll its work back to its savepoint, if it made a statement."""
        take_over(self.session.sync_session)
        if self.touched:
            with self.group.tasks.db.translate():
                await self.group.dialect.undo_in_group(self.group._driver)

    async def close(self) -> None:
        """End the task's session (its statements are the group's now)."""
        sync = self.session.sync_session
        take_over(sync)
        try:
            if self.opened or sync.new or sync.identity_map:
                await self.session.close()  # sends nothing: the transaction is the driver's
        finally:
            sync.info.pop(_TX, None)
            set_driver_lender(sync, None)
            end(sync)
