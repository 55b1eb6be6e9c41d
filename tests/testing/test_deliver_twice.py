"""deliver_twice on a once-handler and a job slot: in-process, concurrent, real processes;
and the proof that it can fail, with a handler that claims nothing."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa
from tests.apps import shop

from oncely import Oncely
from oncely.testing import Call, FakeProvider, JobSlot, deliver_twice

FRIDAY_1800 = "2026-11-27T18:00:00-06:00"


@pytest.mark.parametrize(
    ("concurrently", "processes"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["sequential", "concurrent", "sequential-processes", "concurrent-processes"],
)
async def test_duplicate_delivery_has_one_effect(
    shop_app: Oncely,
    sync_engine: sa.Engine,
    fake_provider: FakeProvider,
    concurrently: bool,
    processes: bool,
) -> None:
    result = await deliver_twice(
        Call(shop.charge_order, 42),
        concurrently=concurrently,
        processes=processes,
        effects=lambda: fake_provider.applied,
    )
    result.assert_once()
    assert sorted(result.statuses) == ["ran", "skipped"]
    assert {d.key for d in result} == {"charge:42"}
    assert shop.payments(sync_engine) == 1
    fake_provider.assert_applied(1)
    if processes:
        pids = {d.pid for d in result}
        assert os.getpid() not in pids and len(pids) == 2
        assert [d.exit_code for d in result] == [0, 0]


async def test_sync_handler_duplicate_delivery_has_one_effect(
    shop_app: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider
) -> None:
    result = await deliver_twice(
        Call(shop.charge_order_sync, 7),
        concurrently=True,
        effects=lambda: shop.payments(sync_engine),
    )
    result.assert_once()
    fake_provider.assert_applied(1)


@pytest.mark.parametrize("processes", [False, True], ids=["in-process", "processes"])
async def test_a_job_slot_delivered_twice_runs_once(
    shop_app: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider, processes: bool
) -> None:
    from datetime import datetime

    target = JobSlot(shop_app, "bonus", datetime.fromisoformat(FRIDAY_1800))
    result = await deliver_twice(
        target, concurrently=True, processes=processes, effects=lambda: fake_provider.applied
    )
    result.assert_once()
    assert set(result.statuses) <= {"ran", "skipped", "busy"}
    assert shop.payments(sync_engine) == 1


# -- the proof that it can fail ---------------------------------------------------------


@pytest.mark.parametrize(
    ("concurrently", "processes"),
    [(False, False), (True, True)],
    ids=["sequential", "concurrent-processes"],
)
async def test_a_handler_without_a_claim_fails_assert_once(
    shop_app: Oncely,
    sync_engine: sa.Engine,
    fake_provider: FakeProvider,
    concurrently: bool,
    processes: bool,
) -> None:
    result = await deliver_twice(
        Call(shop.charge_order_no_claim, 42),
        concurrently=concurrently,
        processes=processes,
        effects=lambda: fake_provider.applied,
    )
    assert result.statuses == ["returned", "returned"]  # not oncely's: judged by its effects
    assert result.effects == 2 and shop.payments(sync_engine) == 2
    with pytest.raises(AssertionError, match="2 effects landed"):
        result.assert_once()


async def test_effects_counted_without_a_double_run_still_fail(
    shop_app: Oncely, fake_provider: FakeProvider
) -> None:
    """assert_once checks the effect count too: one `ran` with two effects is not once."""
    result = await deliver_twice(Call(shop.charge_order, 1), effects=lambda: fake_provider.applied)
    result.assert_once()
    fake_provider.charge(1)  # an effect nobody claimed, between the counts
    doubled = type(result)(result.deliveries, result.effects_before, result.effects_after + 1)
    with pytest.raises(AssertionError, match="2 effects landed"):
        doubled.assert_once()
