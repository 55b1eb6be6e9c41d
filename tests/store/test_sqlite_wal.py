"""SQLite: oncely's engines turn a database into WAL mode even while another connection holds
a lock on it (SQLite's busy handler does not cover that conversion, so the first try fails
at once with "database is locked"; several replicas starting on one new file meet it)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from oncely import Oncely
from oncely.store import sqlite as sqlite_store
from oncely.store.migrations import applied_from


@pytest.fixture
def first_wait(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set when a WAL conversion was refused once and is about to be tried again."""
    refused = threading.Event()
    waits = sqlite_store._wal_waits

    def spied() -> Iterator[float]:
        for n, pause in enumerate(waits()):
            if n == 1:  # the first try failed: this is the pause before the second
                refused.set()
            yield pause

    monkeypatch.setattr(sqlite_store, "_wal_waits", spied)
    return refused


def writer_holding_a_lock(path: Path) -> sqlite3.Connection:
    """A connection in rollback-journal mode with a write transaction open (a RESERVED lock):
    the lock SQLite's busy handler does not wait out for a WAL conversion."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE app_data (x INTEGER)")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO app_data VALUES (1)")
    return conn


def journal_mode(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])


async def test_migrate_waits_for_a_lock_instead_of_failing(
    tmp_path: Path, first_wait: threading.Event
) -> None:
    path = tmp_path / "oncely.db"
    writer = writer_holding_a_lock(path)
    app = Oncely(f"sqlite:///{path}")
    try:
        migrating = asyncio.ensure_future(app.migrate())
        waited = await asyncio.to_thread(first_wait.wait, 10)
        assert waited, "the WAL conversion was never refused: the lock did not hold"
        assert not migrating.done()  # still trying, not failed
        writer.rollback()
        assert await migrating == list(applied_from(1))
    finally:
        writer.close()
        await app.aclose()
    assert journal_mode(path) == "wal"


def test_a_sync_engine_waits_for_the_lock_too(tmp_path: Path, first_wait: threading.Event) -> None:
    path = tmp_path / "oncely.db"
    writer = writer_holding_a_lock(path)
    engine = sa.create_engine(f"sqlite:///{path}")
    sqlite_store.SQLiteDialect().configure_sync_engine(engine)
    released = threading.Thread(target=lambda: (first_wait.wait(10), writer.rollback()))
    released.start()
    try:
        with engine.begin() as conn:  # BEGIN IMMEDIATE, after the connect hook's WAL pragma
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        released.join()
        writer.close()
        engine.dispose()
    assert first_wait.is_set()
    assert journal_mode(path) == "wal"


async def test_replicas_migrating_one_new_file_at_once_all_succeed(tmp_path: Path) -> None:
    """Three apps migrating the same new file, twenty times: every call succeeds, once applied."""
    for round_ in range(20):
        url = f"sqlite:///{tmp_path / f'oncely-{round_}.db'}"
        apps = [Oncely(url) for _ in range(3)]
        try:
            results = await asyncio.gather(*(a.migrate() for a in apps), return_exceptions=True)
        finally:
            for app in apps:
                await app.aclose()
        assert not [r for r in results if isinstance(r, BaseException)], (round_, results)
        assert sorted(len(r) for r in results) == [0, 0, len(applied_from(1))]  # type: ignore[arg-type]
