"""Plain `def` tasks run in the worker's threads, each in its own transaction on a synchronous
connection: a slow one delays no other task and keeps its lease; one given up (its timeout)
never commits. Real SQLite and Postgres, a real worker in this process."""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa
from queue_helpers import drain, effects, in_tx  # type: ignore[import-not-found]

from oncely import Oncely, RetryPolicy
from oncely.queue import list_tasks

INSERT = sa.text("INSERT INTO effects (n) VALUES (:n)")


async def test_a_slow_sync_task_delays_no_other_task_and_keeps_its_lease(
    app: Oncely,
    recorded,  # type: ignore[no-untyped-def]
) -> None:
    """A sync task that blocks its thread for 3 s (three times its worker's 1 s lease), next to
    50 short async tasks in the same worker: the 50 finish first (database time), the slow
    one's lease never runs out, and it runs once."""
    release = threading.Event()

    @app.task
    def slow(db, n: int) -> None:  # type: ignore[no-untyped-def]
        release.wait(3)  # blocks this thread, not the worker's event loop
        db.execute(INSERT, {"n": n})

    @app.task
    async def quick(db, n: int) -> None:  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    await in_tx(app, lambda db: slow.enqueue(db, n=1000))
    await in_tx(app, lambda db: quick.enqueue_many(db, [{"n": n} for n in range(50)]))
    started = time.monotonic()

    async def done() -> bool:
        got = await effects(app)
        if len(got) == 50 and 1000 not in got:
            release.set()  # every quick task landed while the slow one still ran
        return len(got) == 51

    await drain(app, done, concurrency=4, lease=1.0)
    assert release.is_set() and time.monotonic() - started < 60
    recs = {r.task: r for r in await list_tasks(app, limit=100) if r.task == "slow"}
    quick_ends = [r.finished_at for r in await list_tasks(app, limit=100) if r.task == "quick"]
    assert recs["slow"].attempt == 1 and recs["slow"].state.value == "succeeded"
    assert max(quick_ends) < recs["slow"].finished_at  # type: ignore[operator]
    assert recorded.named("task.lease_expired") == []
    assert recorded.named("task.lease_lost") == []


async def test_a_sync_task_given_up_at_its_timeout_never_commits(
    app: Oncely,
    recorded,  # type: ignore[no-untyped-def]
) -> None:
    """The task writes, then blocks past its 0.3 s timeout: the attempt fails at once with
    TimeoutError (its retry recorded), the thread runs on, and when it returns its write rolls
    back instead of committing. The next attempt runs and commits."""
    calls: list[int] = []
    finished = threading.Event()

    @app.task(timeout=0.3, retry=RetryPolicy(attempts=2, wait=0.01, backoff="fixed", jitter=0))
    def late(db, n: int) -> None:  # type: ignore[no-untyped-def]
        calls.append(n)
        db.execute(INSERT, {"n": len(calls)})
        db.flush()
        if len(calls) == 1:
            time.sleep(1.0)
            finished.set()

    rec = await in_tx(app, lambda db: late.enqueue(db, n=7))

    async def done() -> bool:
        return finished.is_set() and await effects(app) == [2]

    await drain(app, done)
    (task,) = [r for r in await list_tasks(app) if r.id == rec.id]
    assert (task.state.value, task.attempt) == ("succeeded", 2)
    (retry,) = recorded.named("task.retry")
    assert retry["error"].startswith("TimeoutError")
    assert await effects(app) == [2]  # the first attempt's write never landed


async def test_a_sync_task_commits_its_work_with_its_ack_or_rolls_it_back(app: Oncely) -> None:
    @app.task
    def writes(db, n: int) -> None:  # type: ignore[no-untyped-def]
        db.execute(INSERT, {"n": n})

    @app.task(retry=RetryPolicy(attempts=1))
    def fails(db, n: int) -> None:  # type: ignore[no-untyped-def]
        db.execute(INSERT, {"n": n})
        raise ValueError("refused after writing")

    @app.task
    def nothing(db, n: int) -> None:  # type: ignore[no-untyped-def]
        return None

    for task, n in ((writes, 1), (fails, 2), (nothing, 3)):
        await in_tx(app, lambda db, t=task, n=n: t.enqueue(db, n=n))

    async def done() -> bool:
        states = sorted(r.state.value for r in await list_tasks(app))
        return states == ["dead", "succeeded", "succeeded"]

    await drain(app, done)
    assert await effects(app) == [1]
