"""The dashboard's reads (`Store.views`), on SQLite and Postgres: keyset pages that walk the
id index in bounded windows and miss or repeat nothing, counts that stop at their cap, and
per-minute counts from the time indexes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

from oncely.store import Store
from oncely.store import views as views_module
from oncely.store.tables import attempts, duplicates, runs, tasks
from oncely.store.views import TaskFilter

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)


def _task(i: int, state: str, **extra: Any) -> dict[str, Any]:
    return {
        "task": "charge" if i % 2 else "receipt",
        "queue": "payments" if i % 3 == 0 else "default",
        "args": {"i": i},
        "state": state,
        "attempt": 0,
        "run_at": T0,
        "created_at": T0 + timedelta(seconds=i),
        "idempotency_key": f"k{i}",
        "concurrency": None,
        "concurrency_key": None,
        **extra,
    }


async def _insert(store: Store, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    async with store.engine.begin() as conn:
        await conn.execute(table.insert(), rows)


async def _walk(store: Store, where: TaskFilter, limit: int) -> tuple[list[int], list[int]]:
    """Every page of a listing: the ids in order, and how many rows each page looked at."""
    ids: list[int] = []
    scanned: list[int] = []
    cursor = None
    for _ in range(1000):
        page = await store.views.task_page(where, cursor, limit, ["charge", "receipt"])
        ids += [t.id for t in page.tasks]
        scanned.append(page.scanned)
        if page.next_cursor is None:
            return ids, scanned
        cursor = page.next_cursor
    raise AssertionError("the walk did not end")


async def test_task_pages_walk_bounded_windows_and_miss_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views_module, "WINDOW", 10)
    states = ["available", "running", "succeeded", "dead", "succeeded", "succeeded", "discarded"]
    await _insert(store, tasks, [_task(i, states[i % 7]) for i in range(60)])
    every_id, _ = await _walk(store, TaskFilter(), 7)
    assert every_id == list(range(60, 0, -1))
    ids, scanned = await _walk(store, TaskFilter(state="succeeded"), 4)
    expected = [i + 1 for i in range(59, -1, -1) if states[i % 7] == "succeeded"]
    assert ids == expected
    assert max(scanned) <= 10  # no page looked at more than one window
    ids, _ = await _walk(store, TaskFilter(state="available", queue="payments", task="receipt"), 3)
    assert ids == [i + 1 for i in range(59, -1, -1) if i % 7 == 0 and i % 3 == 0 and i % 2 == 0]
    ids, _ = await _walk(store, TaskFilter(state="dead"), 2)  # the index of failed tasks
    assert ids == [i + 1 for i in range(59, -1, -1) if i % 7 == 3]
    ids, _ = await _walk(store, TaskFilter(key="k11"), 5)  # the key index, by task name
    assert ids == [12]
    after = TaskFilter(after=T0 + timedelta(seconds=50), before=T0 + timedelta(seconds=55))
    ids, _ = await _walk(store, after, 2)
    assert ids == [55, 54, 53, 52, 51]


async def test_counts_stop_at_their_cap(store: Store) -> None:
    rows = [_task(i, "available") for i in range(8)]
    rows += [_task(i, "available", concurrency=1, concurrency_key="c") for i in range(8, 11)]
    rows += [_task(i, "dead") for i in range(11, 13)]
    await _insert(store, tasks, rows)
    assert await store.views.task_counts(cap=100) == {
        "available": 11,
        "running": 0,
        "succeeded": 0,
        "discarded": 0,
        "dead": 2,
    }
    capped = await store.views.task_counts(cap=5)
    assert capped["available"] == 5 + 3 and capped["dead"] == 2  # each index stops at 5
    by_queue = await store.views.live_by_queue(cap=100)
    assert by_queue == {"payments": {"available": 4}, "default": {"available": 7}}


async def test_per_minute_counts_and_duplicates(store: Store) -> None:
    now = await store.database_time()
    minute = int(now.timestamp() // 60)
    await _insert(
        store,
        runs,
        [
            {"job": "j", "key": str(i), "claimed_at": now, "claimed_by": "r", "scheduled_for": now}
            for i in range(3)
        ]
        + [
            {
                "job": "j",
                "key": "old",
                "claimed_at": now - timedelta(hours=2),
                "claimed_by": "r",
                "scheduled_for": now,
            }
        ],
    )
    base = {"job": "j", "replica": "r", "recorded_at": now, "key": None, "outcome": None}
    await _insert(
        store,
        attempts,
        [
            {**base, "key": "1", "outcome": "failed"},
            {**base, "key": "2", "outcome": "timeout"},
            {**base, "key": "2", "outcome": "missed"},
        ],
    )
    dup = {"job": "j", "replica": "r2", "recorded_at": now, "key": "0", "slot": now}
    await _insert(
        store,
        duplicates,
        [dup, {**dup, "key": "1"}, {**dup, "key": "0", "recorded_at": now - timedelta(days=2)}],
    )
    series = await store.views.per_minute(now - timedelta(hours=1))
    assert series["runs"] == {minute: 3}
    assert series["duplicates"] == {minute: 2}
    assert series["failures"] == {minute: 2}
    assert await store.views.duplicates_since(now - timedelta(hours=24)) == 2
    assert await store.views.duplicates_since(now - timedelta(hours=24), cap=1) == 1
    assert await store.views.duplicates_of("j", ["0", "1", "2"]) == {"0": 2, "1": 1}
    records = await store.views.window_records("j", now - timedelta(days=1), now)
    assert records == []  # these records name no slot


async def test_prune_deletes_old_duplicates(store: Store) -> None:
    from oncely.store.control import Action

    now = await store.database_time()
    dup = {"job": "j", "replica": "r", "key": "0", "slot": now, "recorded_at": now}
    await _insert(store, duplicates, [dup, {**dup, "recorded_at": now - timedelta(days=40)}])
    counts = await store.control.prune(
        Action("ana@ops", "prune", "older than 30d"), now - timedelta(days=30)
    )
    assert counts["duplicates"] == 1
    assert await store.views.duplicates_since(now - timedelta(days=365)) == 1
