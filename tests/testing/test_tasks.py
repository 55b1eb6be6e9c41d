"""The toolkit on oncely's own queue tasks: `TaskRun` delivered twice (sequentially,
concurrently, from real processes) and crashed between its work and the batch's commit (a
real SIGKILL and the in-process SimulatedCrash), then retried; and the proof that it can fail,
with a task whose charge is outside the transaction."""

from __future__ import annotations

import os
import signal

import pytest
import sqlalchemy as sa
from tests.apps import shop

from oncely import Oncely
from oncely.errors import BadInputError, UnknownTaskError
from oncely.model import TaskState
from oncely.testing import FakeProvider, TaskRun, crash_between_work_and_ack, deliver_twice

MODES = pytest.mark.parametrize("process", [True, False], ids=["sigkill", "in-process"])
LEASE = 1.0


def charge(order_id: int, task: str = "charge_order_task") -> TaskRun:
    return TaskRun(
        shop.app, task, idempotency_key=f"charge:{order_id}", lease=LEASE, order_id=order_id
    )


async def only_task(app: Oncely) -> tuple[str, int, TaskState]:
    (rec,) = await app.store.tasks.listing(None, None, 10)
    return rec.task, rec.attempt, rec.state


@pytest.mark.parametrize(
    ("concurrently", "processes"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["sequential", "concurrent", "sequential-processes", "concurrent-processes"],
)
async def test_a_task_delivered_twice_has_one_effect(
    shop_app: Oncely,
    sync_engine: sa.Engine,
    fake_provider: FakeProvider,
    concurrently: bool,
    processes: bool,
) -> None:
    result = await deliver_twice(
        charge(42),
        concurrently=concurrently,
        processes=processes,
        effects=lambda: shop.payments(sync_engine),
    )
    result.assert_once()
    assert sorted(result.statuses) == ["ran", "skipped"]
    assert shop.payments(sync_engine) == 1
    fake_provider.assert_applied(1)
    assert fake_provider.calls == 1  # the duplicate never ran the task's body
    assert await only_task(shop_app) == ("charge_order_task", 1, TaskState.SUCCEEDED)
    (rec,) = await shop_app.store.tasks.listing(None, None, 10)
    assert {d.key for d in result} == {str(rec.id)}
    if processes:
        pids = {d.pid for d in result}
        assert os.getpid() not in pids and len(pids) == 2
        assert [d.exit_code for d in result] == [0, 0]


@MODES
async def test_a_task_crashed_between_work_and_commit_then_retried_has_one_effect(
    shop_app: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider, process: bool
) -> None:
    result = await crash_between_work_and_ack(
        charge(42), process=process, effects=lambda: shop.payments(sync_engine)
    )
    result.assert_once()
    (rec,) = await shop_app.store.tasks.listing(None, None, 10)
    assert result.crashed.status == "crashed" and result.crashed.key == str(rec.id)
    if process:
        assert result.crashed.exit_code == -signal.SIGKILL
        assert result.crashed.pid != os.getpid()
    # The work and the ack were done, the commit was not: the payment row rolled back ...
    assert result.effects_at_crash == 0
    assert (result.retry.status, result.retry.key) == ("ran", str(rec.id))
    assert shop.payments(sync_engine) == 1
    # ... the charge had happened; the retry charged again with the same key: deduplicated.
    assert fake_provider.calls == 2
    fake_provider.assert_applied(1)
    # The crashed attempt counted; the retry (attempt 2) succeeded.
    assert (rec.state, rec.attempt) == (TaskState.SUCCEEDED, 2)


async def test_the_in_process_crash_leaves_the_task_leased_and_rolled_back(
    shop_app: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider
) -> None:
    """The batch rolls back on the BaseException: no payment row, the task is still leased
    (as a killed worker leaves it), not succeeded."""
    seen: list[tuple[str, int, TaskState]] = []

    async def effects() -> int:
        if len(seen) < 2:
            listing = await shop_app.store.tasks.listing(None, None, 10)
            seen.append(
                (listing[0].task, listing[0].attempt, listing[0].state)
                if listing
                else ("", 0, TaskState.AVAILABLE)
            )
        return shop.payments(sync_engine)

    result = await crash_between_work_and_ack(charge(7), process=False, effects=effects)
    result.assert_once()
    assert seen[1] == ("charge_order_task", 1, TaskState.RUNNING)


# -- the proof that it can fail ---------------------------------------------------------


@MODES
async def test_a_task_charging_outside_the_transaction_fails_assert_once(
    shop_app: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider, process: bool
) -> None:
    result = await crash_between_work_and_ack(
        charge(42, "charge_order_task_key_outside"),
        process=process,
        effects=lambda: fake_provider.applied,
    )
    # The queue did its part (one payment row, one success), but the charge happened twice.
    assert result.crashed.status == "crashed" and result.retry.status == "ran"
    assert shop.payments(sync_engine) == 1
    assert result.effects == 2
    with pytest.raises(AssertionError, match="2 effects landed"):
        result.assert_once()


async def test_a_task_that_fails_is_reported_and_fails_assert_once(
    shop_app: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider
) -> None:
    fake_provider.fail_before_apply()
    result = await deliver_twice(charge(9), effects=lambda: shop.payments(sync_engine))
    # The first attempt raised (rolled back, retry scheduled); the redelivery finds the task
    # waiting for that retry.
    assert result.statuses == ["failed", "busy"]
    assert "ProviderError" in (result[0].error or "")
    with pytest.raises(AssertionError, match="0 deliveries ran"):
        result.assert_once()
    assert await only_task(shop_app) == ("charge_order_task", 1, TaskState.AVAILABLE)


# -- the target itself -----------------------------------------------------------------


def test_task_run_checks_its_arguments_before_any_delivery(shop_app: Oncely) -> None:
    with pytest.raises(UnknownTaskError):
        TaskRun(shop.app, "no_such_task", idempotency_key="k")
    with pytest.raises(BadInputError, match="idempotency_key"):
        TaskRun(shop.app, shop.charge_order_task, idempotency_key="", order_id=1)
    with pytest.raises(BadInputError, match="lease"):
        TaskRun(shop.app, shop.charge_order_task, idempotency_key="k", lease=0, order_id=1)
    with pytest.raises(Exception, match="cannot take these arguments"):
        TaskRun(shop.app, shop.charge_order_task, idempotency_key="k", amount=1)
    spec = TaskRun(shop.app, shop.charge_order_task, idempotency_key="k", order_id=1).to_spec()
    assert spec["kind"] == "task" and spec["app"] == "tests.apps.shop:app"
    assert (spec["task"], spec["kwargs"]) == ("charge_order_task", {"order_id": 1})


async def test_clear_empties_the_tasks_too(shop_app: Oncely, fake_provider: FakeProvider) -> None:
    await deliver_twice(charge(3))
    assert len(await shop_app.store.tasks.listing(None, None, 10)) == 1
    await shop_app.store.clear()
    assert await shop_app.store.tasks.listing(None, None, 10) == []
    assert await shop_app.history("@effect") == []


async def test_a_worker_calls_the_seam_for_each_acked_task_before_its_commit(
    db_url: str, sync_engine: sa.Engine
) -> None:
    """The seam a crash test stops at: once per acked task (with or without database work),
    while the batch is still uncommitted; never for a task that failed."""
    import asyncio

    from oncely import hooks
    from oncely.queue import consume

    app = Oncely(db_url, lease=5)
    await app.migrate()
    async with app.store.engine.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE marks (n integer)"))

    @app.task
    async def writes(db, n: int) -> None:  # type: ignore[no-untyped-def]
        await db.execute(sa.text("INSERT INTO marks VALUES (:n)"), {"n": n})

    @app.task
    async def no_database(db, n: int) -> None:  # type: ignore[no-untyped-def]
        return None

    @app.task
    async def fails(db, n: int) -> None:  # type: ignore[no-untyped-def]
        raise ValueError(n)

    seen: list[tuple[str, str, str]] = []

    def at_commit(task: str, key: str) -> None:
        # What another connection sees: the ack is not committed yet.
        with sync_engine.connect() as conn:
            query = sa.text("SELECT state FROM oncely_tasks WHERE id = :id")
            state = conn.execute(query, {"id": int(key)}).scalar_one()
        seen.append((task, key, state))

    from sqlalchemy.ext.asyncio import AsyncSession

    async with AsyncSession(app.store.engine) as db, db.begin():
        ids = [
            (await writes.enqueue(db, n=1)).id,
            (await no_database.enqueue(db, n=2)).id,
            (await fails.enqueue(db, n=3)).id,
        ]
    hooks.add_before_commit(at_commit)
    stopping = asyncio.Event()
    worker = asyncio.create_task(consume(app, stopping, concurrency=1, poll=0.05))
    try:
        for _ in range(1500):
            counts = await app.store.tasks.count()
            if counts.get("succeeded") == 2:
                break
            await asyncio.sleep(0.02)
    finally:
        stopping.set()
        await asyncio.wait_for(worker, 30)
        hooks.remove_before_commit(at_commit)
        await app.aclose()
    assert sorted(seen) == [
        ("no_database", str(ids[1]), "running"),
        ("writes", str(ids[0]), "running"),
    ]
