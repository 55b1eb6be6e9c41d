"""Enqueue notifications (Postgres): one per enqueueing transaction, however many tasks it
enqueues; none where the server setting `oncely.notify` is `off`, and the workers then poll."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from queue_helpers import EFFECTS_DDL, drain  # type: ignore[import-not-found]
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from oncely import Oncely, TaskState
from oncely.queue import worker
from oncely.work.tasks.wakeups import ROLL_CALL

pytestmark = pytest.mark.postgres

CHANNEL = "oncely_tasks"
MARK = "mark:"


class Heard:
    """The payloads a LISTEN on the tasks channel received, on a connection of its own (the
    server's default settings: the enqueuer's `oncely.notify` is not the listener's)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.payloads: list[str] = []
        self.marked = asyncio.Event()

    def __call__(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.append(payload)
        if payload.startswith(MARK):
            self.marked.set()

    async def all_before_mark(self) -> list[str]:
        """Everything heard until a mark sent now arrives: notifications reach a listener in
        the order their transactions committed, so any an earlier commit sent came first."""
        await self.conn.execute(f"SELECT pg_notify('{CHANNEL}', '{MARK}end')")
        await asyncio.wait_for(self.marked.wait(), 30)
        return [p for p in self.payloads if not p.startswith(MARK)]


def _asyncpg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@asynccontextmanager
async def listening(url: str) -> AsyncIterator[Heard]:
    conn = await asyncpg.connect(_asyncpg_dsn(url))
    heard = Heard(conn)
    await conn.add_listener(CHANNEL, heard)
    try:
        yield heard
    finally:
        await conn.close()


@asynccontextmanager
async def app_on(url: str, **server_settings: str) -> AsyncIterator[Oncely]:
    """A migrated app on its own engine, whose connections carry `server_settings`."""
    engine = create_async_engine(
        make_url(url).set(drivername="postgresql+asyncpg"),
        connect_args={"server_settings": server_settings},
    )
    app = Oncely(engine)
    await app.migrate()
    async with engine.begin() as conn:
        await conn.execute(sa.text(EFFECTS_DDL))
    try:
        yield app
    finally:
        await app.aclose()
        await engine.dispose()


@pytest.fixture
def pg_url(postgres_database: str) -> str:
    from tests.conftest import _reset_postgres

    _reset_postgres(postgres_database)
    return postgres_database


async def test_the_enqueues_of_one_transaction_send_one_notification(pg_url: str) -> None:
    async with app_on(pg_url) as app, listening(pg_url) as heard:

        @app.task
        async def note(db, n: int) -> None:  # type: ignore[no-untyped-def]
            pass

        async with AsyncSession(app.store.engine) as db, db.begin():
            for n in range(5):
                await note.enqueue(db, n=n)
            await note.enqueue_many(db, [{"n": n} for n in range(5, 10)])
        assert len(await heard.all_before_mark()) == 1


async def test_with_notify_off_an_enqueue_sends_nothing_and_a_worker_drains_by_polling(
    pg_url: str,
) -> None:
    async with app_on(pg_url, **{"oncely.notify": "off"}) as app, listening(pg_url) as heard:

        @app.task
        async def note(db, n: int) -> None:  # type: ignore[no-untyped-def]
            await db.execute(sa.text("INSERT INTO effects (n) VALUES (:n)"), {"n": n})

        async with AsyncSession(app.store.engine) as db, db.begin():
            records = [await note.enqueue(db, n=n) for n in range(3)]
            records += await note.enqueue_many(db, [{"n": n} for n in range(3, 6)])
        lanes_worker = worker(app, poll=0.05)
        stopping = asyncio.Event()
        consuming = asyncio.create_task(lanes_worker.consume(stopping))
        try:
            deadline = time.monotonic() + 30
            while {(await app.task_record(r.id)).state for r in records} != {TaskState.SUCCEEDED}:
                assert time.monotonic() < deadline, "the worker did not drain the tasks"
                assert not consuming.done()
                await asyncio.sleep(0.02)
            assert not lanes_worker.listening  # it polls: it was never told to wake
        finally:
            stopping.set()
            await asyncio.wait_for(consuming, 30)
        # Nor does the word sent by hand when tasks are handed back or retried.
        async with app.store.engine.begin() as conn:
            await app.store.dialect.notify_tasks(conn)
        # Only the worker's roll call at its start and stop (twice in its life, not per task).
        assert [p for p in await heard.all_before_mark() if p != ROLL_CALL] == []


async def test_notify_off_for_one_transaction_sends_nothing_for_it_alone(pg_url: str) -> None:
    async with app_on(pg_url) as app, listening(pg_url) as heard:

        @app.task
        async def note(db, n: int) -> None:  # type: ignore[no-untyped-def]
            pass

        async with AsyncSession(app.store.engine) as db, db.begin():
            await db.execute(sa.text("SET LOCAL oncely.notify = 'off'"))
            await note.enqueue(db, n=1)
        assert await heard.all_before_mark() == []
        async with AsyncSession(app.store.engine) as db, db.begin():
            await note.enqueue(db, n=2)
        assert len(await heard.all_before_mark()) == 1
        await drain(app, lambda: _all_done(app), poll=0.05)


async def _all_done(app: Oncely) -> bool:
    counts = await app.store.tasks.count()
    return counts.get("available", 0) == 0 and counts.get("running", 0) == 0
