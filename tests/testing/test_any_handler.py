"""The toolkit referees any queue's handler, not only oncely's: a handler that is not
oncely's is judged by the effects the test counts, and its `crash_point()` is where
`crash_between_work_and_ack` stops it. A correct one passes; a naive one fails for the
right reason, a double effect."""

from __future__ import annotations

import signal

import pytest
import sqlalchemy as sa
from tests.apps import queue_handlers, shop

from oncely import Oncely
from oncely.testing import (
    Call,
    FakeProvider,
    crash_between_work_and_ack,
    deliver_twice,
)

MODES = pytest.mark.parametrize("process", [True, False], ids=["sigkill", "in-process"])
DELIVERIES = pytest.mark.parametrize(
    ("concurrently", "processes"),
    [(False, False), (True, True)],
    ids=["sequential", "concurrent-processes"],
)


@pytest.fixture
def handlers(shop_app: Oncely, sync_engine: sa.Engine) -> Oncely:
    with sync_engine.begin() as conn:
        conn.exec_driver_sql(queue_handlers.HANDLER_TABLES)
    return shop_app


@DELIVERIES
async def test_a_correct_handler_that_is_not_oncely_s_passes_deliver_twice(
    handlers: Oncely,
    sync_engine: sa.Engine,
    fake_provider: FakeProvider,
    concurrently: bool,
    processes: bool,
) -> None:
    result = await deliver_twice(
        Call(queue_handlers.charge_dedup, "m-1", 42),
        concurrently=concurrently,
        processes=processes,
        effects=lambda: fake_provider.applied,
    )
    assert result.statuses == ["returned", "returned"]
    result.assert_once()  # two deliveries returned, one effect: once
    assert shop.payments(sync_engine) == 1


@DELIVERIES
async def test_a_naive_handler_fails_deliver_twice_with_the_double_effect(
    handlers: Oncely,
    fake_provider: FakeProvider,
    concurrently: bool,
    processes: bool,
) -> None:
    result = await deliver_twice(
        Call(queue_handlers.charge_naive, "m-1", 42),
        concurrently=concurrently,
        processes=processes,
        effects=lambda: fake_provider.applied,
    )
    assert result.effects == 2
    with pytest.raises(AssertionError) as failed:
        result.assert_once()
    message = str(failed.value)
    assert "2 effects landed (expected 1)" in message and "deliveries ran" not in message


@MODES
async def test_a_correct_handler_crashed_at_its_crash_point_then_retried_passes(
    handlers: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider, process: bool
) -> None:
    result = await crash_between_work_and_ack(
        Call(queue_handlers.charge_dedup, "m-1", 42),
        process=process,
        effects=lambda: fake_provider.applied,
    )
    assert result.crashed.status == "crashed" and result.crashed.key == "m-1"
    if process:
        assert result.crashed.exit_code == -signal.SIGKILL
    assert result.effects_at_crash == 1  # charged before the crash
    assert result.retry.status == "returned" and fake_provider.calls == 2
    result.assert_once()
    assert shop.payments(sync_engine) == 1  # the crashed attempt's row rolled back


@MODES
async def test_a_naive_handler_crashed_at_its_crash_point_fails_with_the_double_charge(
    handlers: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider, process: bool
) -> None:
    result = await crash_between_work_and_ack(
        Call(queue_handlers.charge_naive, "m-1", 42),
        process=process,
        effects=lambda: fake_provider.applied,
    )
    assert result.crashed.status == "crashed"  # stopped where it said, not a harness mismatch
    assert result.effects == 2 and shop.payments(sync_engine) == 1
    with pytest.raises(AssertionError) as failed:
        result.assert_once()
    message = str(failed.value)
    assert "2 effects landed (expected 1)" in message
    assert "not stopped" not in message and "retry" not in message


async def test_a_handler_that_is_not_oncely_s_needs_effects_to_be_judged(
    handlers: Oncely,
) -> None:
    result = await deliver_twice(Call(queue_handlers.charge_dedup, "m-1", 42))
    with pytest.raises(AssertionError, match="pass effects="):
        result.assert_once()
    crash = await crash_between_work_and_ack(
        Call(queue_handlers.charge_dedup, "m-2", 43), process=False
    )
    with pytest.raises(AssertionError, match="pass effects="):
        crash.assert_once()
