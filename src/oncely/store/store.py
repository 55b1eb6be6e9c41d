"""`Store`: oncely's tables in one database: the database core (`Database`) and its areas.

Each area is handed the core, never the `Store`: `claims` (a slot's attempt, its claim and
end; the ledger), `tasks` (the task queue), `control` (pauses, attempt records, audited
operator actions) and `views` (the dashboard's reads).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from ..errors import DatabaseUnavailableError
from ..model import TaskRecord
from . import control, schedules, sql, task_queue, task_queue_sql, views
from .claims import Claims
from .database import Database
from .dialects import dialect_for
from .lost_commit import task_landed
from .urls import normalize_url
from .worker_connections import WorkerConnections


class Store(Database):
    """oncely's tables in one database: the core (engine, dialect, errors, reads, schema),
    and the areas that run their statements on it. Each area is handed the core and typed
    against it (`Database`), so that none reaches another area through the store."""

    def __init__(self, engine: AsyncEngine, *, owns_engine: bool) -> None:
        super().__init__(engine, owns_engine=owns_engine)
        # Built with the store, not at first use: on asyncpg it sets the engine's pool up
        # for attempts run on the driver (a connection checked in mid-transaction is closed).
        self.claims = Claims(self)
        """A slot's attempt, its claim and its end; the ledger of claims; releases."""

    @classmethod
    def from_url(cls, url: str) -> Store:
        """Build the engine for a URL (Postgres via asyncpg, SQLite via aiosqlite)."""
        full = normalize_url(url)
        dialect = dialect_for(make_url(full).get_backend_name())
        engine = create_async_engine(full, **dialect.engine_options())
        dialect.configure_engine(engine)
        return cls(engine, owns_engine=True)

    @functools.cached_property
    def tasks(self) -> task_queue.TaskQueue:
        """The task queue's statements on this store."""
        return task_queue.TaskQueue(self)

    @functools.cached_property
    def control(self) -> control.Control:
        """The control plane's statements on this store (pauses, attempts, audit, cancel)."""
        return control.Control(self, self.tasks)

    @functools.cached_property
    def views(self) -> views.Views:
        """The dashboard's reads on this store (bounded by indexes, never a whole table)."""
        return views.Views(self)

    @functools.cached_property
    def schedules(self) -> schedules.ScheduleStore:
        """The statements of schedules kept as data on this store (oncely_schedules)."""
        return schedules.ScheduleStore(self)

    def worker_connections(self) -> WorkerConnections:
        """A task worker's connections and the statements its parts send on them (each
        worker gets its own: it opens and closes them)."""
        return WorkerConnections(self, self.tasks, self.control)

    async def dispose(self) -> None:
        """Close the attempts' kept connections, then the core's engines."""
        await self.claims.close()
        await super().dispose()

    async def clear(self) -> int:
        """Delete every claim and every task (for test databases); how many claims there were."""
        with self.translate():
            async with self.engine.begin() as conn:
                await conn.execute(task_queue_sql.clear())
                if self.has_task_errors:
                    await conn.execute(task_queue_sql.clear_errors())
                return int((await conn.execute(sql.clear())).rowcount)

    def listen(
        self,
        on_notify: Callable[[str], None],
        *,
        engine: AsyncEngine | None = None,
        on_lost: Callable[[], None] | None = None,
        prober: AsyncEngine | None = None,
    ) -> contextlib.AbstractAsyncContextManager[bool]:
        """Call `on_notify(key)` (see Dialect.listener) whenever tasks are enqueued, while
        the context is open (on a connection of `engine`, default the store's), and
        `on_lost()` if that connection goes away; yields whether notifications work (a
        probe, sent on a connection of `prober`, default `engine`, came back: without them
        a worker relies on polling alone)."""
        return self.dialect.listener(engine or self.engine, on_notify, on_lost, prober)

    async def enqueue(
        self, entries: Sequence[dict[str, Any]]
    ) -> tuple[list[TaskRecord], bool | None]:
        """Insert tasks in a transaction of their own, committed on return (a producer with
        no transaction to join: the CLI, a test); see `task_queue.enqueue` for `entries`.

        With the records, whether they committed: True; or, when the connection was lost
        during COMMIT, what reading the first new task back says (False: rolled back; None:
        it cannot be read, the outcome is unknown). A lost COMMIT of duplicates only, which
        inserted nothing, raises DatabaseUnavailableError.
        """
        await self.ensure_schema()
        async with AsyncSession(self.engine) as db:
            with self.translate():
                await db.begin()
                records = await task_queue.enqueue(db, entries)
                # What a lost COMMIT's fate is asked by (Postgres; one more round trip on
                # this path of producers without a transaction of their own).
                xid = await self.dialect.xact_id(db)
            try:
                with self.translate():
                    await db.commit()
            except DatabaseUnavailableError:
                new = [rec for rec in records if not rec.duplicate]
                if not new:
                    raise  # nothing was inserted: a lost COMMIT changed nothing
                return records, await task_landed(self, new[0].id, xid)
        return records, True
