"""On the engine oncely builds, a clean attempt's connection is held for the next attempt.

What that must never cost: a connection given back to the server when the app closes, a
bounded number held, and no connection carried from one event loop into another. (A held
connection the server killed is pinged and replaced: tests/store/test_stale_connection.py.
What a failed or cancelled attempt leaves on its connection: test_attempt_transaction.py.)
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
import warnings
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from tests.conftest import _reset_postgres, _sync_url

from oncely import Oncely, RunStatus, every
from oncely.store.held import HOLD_AT_MOST

pytestmark = pytest.mark.postgres

SLOT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def pid_app(url: str, pids: list[int]) -> Oncely:
    """An app whose job `pid` records the server process of the connection it runs on."""
    app = Oncely(url)

    @app.job(every(seconds=1), name="pid")
    async def pid(db, now) -> None:  # type: ignore[no-untyped-def]
        pids.append((await db.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one())

    return app


def alive(sync_engine: sa.Engine, pid: int) -> bool:
    with sync_engine.connect() as conn:
        found = conn.execute(
            sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).scalar_one()
    return bool(found)


async def test_attempts_in_a_row_share_one_held_connection_until_the_app_closes(
    postgres_database: str,
) -> None:
    _reset_postgres(postgres_database)
    sync_engine = sa.create_engine(_sync_url(postgres_database))
    pids: list[int] = []
    app = pid_app(postgres_database, pids)
    try:
        await app.migrate()
        pool = app.store.engine.sync_engine.pool
        for second in range(3):
            assert (await app.run("pid", now=SLOT + timedelta(seconds=second))).status is (
                RunStatus.RAN
            )
            assert pool.checkedout() == 1  # type: ignore[attr-defined]  # held, not pooled
        assert len(set(pids)) == 1
    finally:
        await app.aclose()
    # Closing the app gives the held connection back: its server process goes away.
    deadline = time.monotonic() + 10
    while alive(sync_engine, pids[0]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not alive(sync_engine, pids[0])
    sync_engine.dispose()


async def test_at_most_a_few_connections_are_held(postgres_database: str) -> None:
    _reset_postgres(postgres_database)
    app = Oncely(postgres_database)
    running = 0
    all_in = asyncio.Event()

    @app.job(every(seconds=1), name="together", overlap="allow")
    async def together(db, now) -> None:  # type: ignore[no-untyped-def]
        nonlocal running
        await db.execute(sa.text("SELECT 1"))
        running += 1
        if running == 5:
            all_in.set()
        await all_in.wait()  # five attempts, five connections, all open at once

    try:
        await app.migrate()
        slots = [SLOT + timedelta(seconds=s) for s in range(5)]
        results = await asyncio.wait_for(
            asyncio.gather(*(app.run("together", now=slot) for slot in slots)), 30
        )
        assert [r.status for r in results] == [RunStatus.RAN] * 5
        assert app.store.engine.sync_engine.pool.checkedout() == HOLD_AT_MOST  # type: ignore[attr-defined]
    finally:
        await app.aclose()


def test_a_connection_held_by_a_finished_event_loop_is_not_reused(
    postgres_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`asyncio.run(app.run(...))` per call (a sync web app): each call gets a connection of
    its own loop; the one left from the previous loop is dropped without an error."""
    _reset_postgres(postgres_database)
    pids: list[int] = []
    app = pid_app(postgres_database, pids)

    async def first() -> RunStatus:
        await app.migrate()  # its connection goes back to the pool, and the attempt takes it
        return (await app.run("pid", now=SLOT)).status

    with caplog.at_level(logging.WARNING):
        assert asyncio.run(first()) is RunStatus.RAN
        for second in range(1, 3):
            result = asyncio.run(app.run("pid", now=SLOT + timedelta(seconds=second)))
            assert result.status is RunStatus.RAN
        asyncio.run(app.aclose())
    assert len(set(pids)) == 3  # a new connection for each loop
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_loop_in_another_thread_keeps_its_own_held_connection(
    postgres_database: str,
) -> None:
    """Two loops at once (a thread with its own, as oncely.testing runs one when a loop is
    already running): each reuses its own connection, and neither touches the other's."""
    _reset_postgres(postgres_database)
    pids: list[int] = []
    app = pid_app(postgres_database, pids)
    await app.migrate()
    assert (await app.run("pid", now=SLOT)).status is RunStatus.RAN  # the main loop holds one
    mine = pids[-1]
    thread_pids: list[int] = []
    errors: list[BaseException] = []
    main_ran = threading.Event()

    async def in_thread() -> None:
        for second in (10, 11):
            assert (await app.run("pid", now=SLOT + timedelta(seconds=second))).status is (
                RunStatus.RAN
            )
            thread_pids.append(pids[-1])
            if second == 10:  # hold ours while the main loop runs an attempt
                await asyncio.get_running_loop().run_in_executor(None, main_ran.wait, 30)

    def thread_main() -> None:
        try:
            asyncio.run(in_thread())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=thread_main)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not thread_pids and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert (await app.run("pid", now=SLOT + timedelta(seconds=1))).status is RunStatus.RAN
        assert pids[-1] == mine  # the main loop's own held connection, not the thread's
    finally:
        main_ran.set()
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 30)
        await app.aclose()
    assert errors == []
    assert len(thread_pids) == 2 and thread_pids[0] == thread_pids[1] != mine


async def test_an_app_dropped_without_closing_lets_its_connection_go_quietly(
    postgres_database: str,
) -> None:
    """Like a pooled connection, a held one goes with its app, without SQLAlchemy's warning
    about a connection never checked in."""
    _reset_postgres(postgres_database)
    sync_engine = sa.create_engine(_sync_url(postgres_database))
    pids: list[int] = []

    async def run_once() -> None:
        app = pid_app(postgres_database, pids)
        await app.migrate()
        assert (await app.run("pid", now=SLOT)).status is RunStatus.RAN

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await run_once()
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, sa.exc.SAWarning)] == []
    deadline = time.monotonic() + 10
    while alive(sync_engine, pids[0]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not alive(sync_engine, pids[0])
    sync_engine.dispose()
