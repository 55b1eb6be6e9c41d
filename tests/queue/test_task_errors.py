"""Every failed attempt's error is kept (schema 11): one row per retried, dead or discarded
attempt, written with the outcome on the task row, gone with the task when it is pruned,
kept across an operator's retry; none on an older database. Real SQLite and Postgres."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from queue_helpers import drain, in_tx  # type: ignore[import-not-found]

from oncely import Oncely, RetryPolicy, TaskState
from oncely.errors import SchemaMissingError
from oncely.queue import worker
from oncely.store.migrations import applied_from
from oncely.store.task_queue import Leased, Settle
from oncely.work.tasks import TaskWorker
from oncely.work.tasks.outcome import Outcome

FAST = {"wait": 0.01, "backoff": "fixed", "jitter": 0}


class Transient(Exception):
    pass


class Fatal(Exception):
    pass


async def error_rows(app: Oncely, task_id: int) -> list[Any]:
    """(attempt, error's first line, by) of a task's history rows, oldest first."""
    async with app.store.engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT attempt, error, by, at FROM oncely_task_errors "
                "WHERE task_id = :id ORDER BY id"
            ),
            {"id": task_id},
        )
        return [(r.attempt, r.error.split("\n", 1)[0], r.by) for r in rows]


async def task_row(app: Oncely, task_id: int) -> tuple[str, int, str | None]:
    rec = await app.task_record(task_id)
    return rec.state.value, rec.attempt, (rec.error or "").split("\n", 1)[0] or None


async def next_step(runner: TaskWorker, timeout: float = 10.0) -> list[Outcome]:
    """One step that ran a task: polls (a retry comes due after its short wait)."""
    deadline = time.monotonic() + timeout
    while True:
        outcomes = await runner.step()
        if outcomes:
            return outcomes
        assert time.monotonic() < deadline, "no task came due"
        await asyncio.sleep(0.01)


async def test_each_failed_attempt_keeps_its_error_with_the_retry(app: Oncely) -> None:
    """A task that fails twice, then succeeds: after each failure its row's error and a new
    history row say the same (written together), attempts 1 and 2; the success adds none."""
    calls: list[int] = []

    @app.task(retry=RetryPolicy(attempts=5, **FAST))  # type: ignore[arg-type]
    async def charge(db, n: int):  # type: ignore[no-untyped-def]
        calls.append(n)
        if len(calls) < 3:
            raise Transient(f"gateway timeout #{len(calls)}")

    rec = await in_tx(app, lambda db: charge.enqueue(db, n=7))
    runner = worker(app)
    try:
        assert await error_rows(app, rec.id) == []
        await next_step(runner)
        by = runner.by
        assert await task_row(app, rec.id) == ("available", 1, "Transient: gateway timeout #1")
        assert await error_rows(app, rec.id) == [(1, "Transient: gateway timeout #1", by)]
        await next_step(runner)
        assert await task_row(app, rec.id) == ("available", 2, "Transient: gateway timeout #2")
        assert await error_rows(app, rec.id) == [
            (1, "Transient: gateway timeout #1", by),
            (2, "Transient: gateway timeout #2", by),
        ]
        await next_step(runner)
    finally:
        await runner.close()
    assert (await app.task_record(rec.id)).state is TaskState.SUCCEEDED
    assert len(await error_rows(app, rec.id)) == 2
    history = await app.task_errors(rec.id)
    assert history.kept and not history.more
    assert [e.attempt for e in history.errors] == [2, 1]  # newest first
    assert "Traceback" in (history.errors[0].error or "")
    assert "gateway timeout #2" in (history.errors[0].error or "")
    assert history.errors[0].at >= history.errors[1].at


async def test_a_dead_task_keeps_all_its_attempts_and_prune_removes_them(app: Oncely) -> None:
    @app.task(retry=RetryPolicy(attempts=3, **FAST))  # type: ignore[arg-type]
    async def sync_up(db, n: int):  # type: ignore[no-untyped-def]
        raise Transient(f"down {n}")

    @app.task(retry=RetryPolicy(attempts=3, discard_on=[Fatal], **FAST))  # type: ignore[arg-type]
    async def bad(db):  # type: ignore[no-untyped-def]
        raise Fatal("refused")

    @app.task
    async def fine(db):  # type: ignore[no-untyped-def]
        pass

    dead = await in_tx(app, lambda db: sync_up.enqueue(db, n=1))
    discarded = await in_tx(app, lambda db: bad.enqueue(db))
    ok = await in_tx(app, lambda db: fine.enqueue(db))
    runner = worker(app)
    try:
        for _ in range(3):
            await next_step(runner)
    finally:
        await runner.close()
    assert (await app.task_record(dead.id)).state is TaskState.DEAD
    assert await error_rows(app, dead.id) == [
        (a, "Transient: down 1", runner.by) for a in (1, 2, 3)
    ]
    assert (await app.task_record(discarded.id)).state is TaskState.DISCARDED
    assert await error_rows(app, discarded.id) == [(1, "Fatal: refused", runner.by)]
    assert await error_rows(app, ok.id) == []

    # An operator's retry starts the attempts again at 1: the history before it stays.
    await app.retry_task(dead.id)
    runner = worker(app)
    try:
        await next_step(runner)
    finally:
        await runner.close()
    assert [a for a, _, _ in await error_rows(app, dead.id)] == [1, 2, 3, 1]

    # Prune deletes a finished task's errors with it (in batches: here 1 task a batch).
    later = await app.store.database_time() + timedelta(1)
    assert await app.store.tasks.prune(later, batch=1) == (2, 0)
    assert await error_rows(app, discarded.id) == []
    assert await error_rows(app, ok.id) == []
    # The retried task is available again (not finished): it and its history stay.
    assert len(await error_rows(app, dead.id)) == 4
    await app.discard_task(dead.id)
    await app.store.tasks.prune(await app.store.database_time() + timedelta(1), batch=1)
    assert await error_rows(app, dead.id) == []
    async with app.store.engine.connect() as conn:
        left = await conn.execute(sa.text("SELECT count(*) FROM oncely_task_errors"))
        assert left.scalar() == 0


async def test_a_lost_lease_writes_no_error(app: Oncely) -> None:
    """A settle whose lease is no longer ours writes neither the row nor its history."""

    @app.task
    async def charge(db):  # type: ignore[no-untyped-def]
        pass

    rec = await in_tx(app, lambda db: charge.enqueue(db))
    runner = worker(app)
    async with app.store.engine.connect() as conn:  # the worker's, outside `consume`
        (item,) = await app.store.tasks.fetch(conn, None, 1, "mine", "me", 30)
    stale = Leased(item.id, item.task, item.args, item.attempt, item.queue, "not-mine")
    failed = Settle(stale, TaskState.AVAILABLE, 0.0, "Transient: lost")
    assert await app.store.tasks.settle([failed]) == set()
    assert await error_rows(app, rec.id) == []
    # Its holder's own settle writes both.
    assert await app.store.tasks.settle([Settle(item, TaskState.DEAD, None, "Transient: x")]) == {
        rec.id
    }
    assert await error_rows(app, rec.id) == [(1, "Transient: x", "me")]
    # An operator's cancel (a discard the worker writes) is no failure: no history row.
    await app.retry_task(rec.id)
    async with app.store.engine.connect() as conn:  # the worker's, outside `consume`
        (item,) = await app.store.tasks.fetch(conn, None, 1, "again", "me", 30)
    cancel = Settle(item, TaskState.DISCARDED, None, "TaskCancelledError: x", kept=False)
    assert await app.store.tasks.settle([cancel]) == {rec.id}
    assert await error_rows(app, rec.id) == [(1, "Transient: x", "me")]
    await runner.close()


async def test_a_database_before_v11_is_migrated_before_it_keeps_history(db_url: str) -> None:
    """A database at schema 10 is older than this oncely runs on (14): it says "run `oncely
    migrate`", and `migrate` adds the history table; failures from then on are kept."""
    app = Oncely(db_url, lease=5)
    await app.migrate()
    async with app.store.engine.begin() as conn:
        await conn.execute(sa.text("DROP TABLE oncely_task_errors"))
        await conn.execute(sa.text("DELETE FROM oncely_schema WHERE version >= 11"))  # v10
    await app.aclose()

    app = Oncely(db_url, lease=5)

    @app.task(retry=RetryPolicy(attempts=2, **FAST))  # type: ignore[arg-type]
    async def flaky(db):  # type: ignore[no-untyped-def]
        raise Transient("no luck")

    try:
        with pytest.raises(SchemaMissingError, match="oncely migrate"):
            await app.store.ensure_schema()
        assert await app.migrate() == list(applied_from(11))
        rec = await in_tx(app, lambda db: flaky.enqueue(db))
        for _ in range(2):
            runner = worker(app)
            try:
                await next_step(runner)
            finally:
                await runner.close()
        assert await task_row(app, rec.id) == ("dead", 2, "Transient: no luck")
        assert [a for a, _e, _b in await error_rows(app, rec.id)] == [1, 2]
    finally:
        await app.aclose()


async def test_a_sync_tasks_failure_is_kept_the_same_way(app: Oncely) -> None:
    """A plain `def` task fails in its worker thread: the same settle keeps its error."""
    calls: list[int] = []

    @app.task(retry=RetryPolicy(attempts=3, **FAST))  # type: ignore[arg-type]
    def export(db, n: int):  # type: ignore[no-untyped-def]
        calls.append(n)
        if len(calls) == 1:
            raise Transient(f"disk full {n}")

    rec = await in_tx(app, lambda db: export.enqueue(db, n=3))
    runner = worker(app)
    try:
        await next_step(runner)
        assert await error_rows(app, rec.id) == [(1, "Transient: disk full 3", runner.by)]
        await next_step(runner)
    finally:
        await runner.close()
    assert (await app.task_record(rec.id)).state is TaskState.SUCCEEDED
    assert await error_rows(app, rec.id) == [(1, "Transient: disk full 3", runner.by)]


async def test_a_running_worker_keeps_each_failure(app: Oncely) -> None:
    """The same through `consume`, whose settles go on its own connection (on Postgres in
    autocommit: each failure's outcome and history row are one statement there)."""

    @app.task(retry=RetryPolicy(attempts=3, **FAST))  # type: ignore[arg-type]
    async def flaky(db, n: int):  # type: ignore[no-untyped-def]
        raise Transient(f"n={n}")

    recs = [await in_tx(app, lambda db, n=n: flaky.enqueue(db, n=n)) for n in range(4)]

    async def all_dead() -> bool:
        states = [(await app.task_record(r.id)).state for r in recs]
        return states == [TaskState.DEAD] * len(recs)

    await drain(app, all_dead, concurrency=4)
    for n, rec in enumerate(recs):
        assert [(a, e) for a, e, _ in await error_rows(app, rec.id)] == [
            (a, f"Transient: n={n}") for a in (1, 2, 3)
        ]
