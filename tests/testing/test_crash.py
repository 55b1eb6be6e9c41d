"""crash_between_work_and_ack: a real SIGKILL at the commit and the in-process crash, then
the retry; and the proof that it can fail, with an effect outside the transaction."""

from __future__ import annotations

import os
import signal
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from tests.apps import shop

from oncely import Oncely
from oncely.testing import Call, FakeProvider, JobSlot, crash_between_work_and_ack

FRIDAY_1800 = datetime.fromisoformat("2026-11-27T18:00:00-06:00")
MODES = pytest.mark.parametrize("process", [True, False], ids=["sigkill", "in-process"])


@MODES
async def test_crash_between_work_and_ack_then_retry_has_one_effect(
    shop_app: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider, process: bool
) -> None:
    result = await crash_between_work_and_ack(
        Call(shop.charge_order, 42), process=process, effects=lambda: fake_provider.applied
    )
    result.assert_once()
    assert result.crashed.status == "crashed" and result.crashed.key == "charge:42"
    if process:
        assert result.crashed.exit_code == -signal.SIGKILL
        assert result.crashed.pid != os.getpid()
    # The work happened before the crash (the provider was charged), the commit did not:
    assert result.effects_at_crash == 1
    assert result.retry.status == "ran"
    assert fake_provider.calls == 2  # the retry called the provider again ...
    fake_provider.assert_applied(1)  # ... which recognised the idempotency key
    assert shop.payments(sync_engine) == 1
    # The crashed attempt left no claim behind; the retry's claim is the only one.
    claims = await shop_app.history("@effect")
    assert [(c.key, c.claimed_by.endswith(f":{os.getpid()}")) for c in claims] == [
        ("charge:42", True)
    ]


@MODES
async def test_crash_in_a_sync_handler(
    shop_app: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider, process: bool
) -> None:
    result = await crash_between_work_and_ack(
        Call(shop.charge_order_sync, 5),
        process=process,
        effects=lambda: shop.payments(sync_engine),
    )
    result.assert_once()
    fake_provider.assert_applied(1)


@MODES
async def test_crash_of_a_job_slot_then_retry(
    shop_app: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider, process: bool
) -> None:
    result = await crash_between_work_and_ack(
        JobSlot(shop_app, "bonus", FRIDAY_1800),
        process=process,
        effects=lambda: fake_provider.applied,
    )
    result.assert_once()
    assert result.crashed.key == "2026-11-28T00:00:00Z"
    assert shop.payments(sync_engine) == 1


# -- the proof that it can fail ---------------------------------------------------------


@MODES
async def test_an_effect_outside_the_transaction_fails_assert_once(
    shop_app: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider, process: bool
) -> None:
    result = await crash_between_work_and_ack(
        Call(shop.charge_order_key_outside, 42),
        process=process,
        effects=lambda: fake_provider.applied,
    )
    # The claim did its part (one payment row), but the charge without a key happened twice.
    assert result.crashed.status == "crashed" and result.retry.status == "ran"
    assert shop.payments(sync_engine) == 1
    assert result.effects == 2
    with pytest.raises(AssertionError, match="2 effects landed"):
        result.assert_once()


async def test_a_scheduled_job_with_an_effect_outside_fails_assert_once(
    shop_app: Oncely, fake_provider: FakeProvider
) -> None:
    result = await crash_between_work_and_ack(
        JobSlot(shop_app, "bonus_outside", FRIDAY_1800), effects=lambda: fake_provider.applied
    )
    with pytest.raises(AssertionError, match="2 effects landed"):
        result.assert_once()


@MODES
async def test_a_handler_without_a_claim_is_never_stopped_and_fails(
    shop_app: Oncely, sync_engine: sa.Engine, fake_provider: FakeProvider, process: bool
) -> None:
    result = await crash_between_work_and_ack(
        Call(shop.charge_order_no_claim, 42),
        process=process,
        effects=lambda: fake_provider.applied,
    )
    assert result.crashed.status == "returned"  # it committed on its own: nothing to stop
    assert shop.payments(sync_engine) == 2
    with pytest.raises(AssertionError, match="not stopped between work and commit"):
        result.assert_once()


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # the server's sessions
async def test_the_retry_waits_for_the_killed_childs_session_to_end(
    shop_app: Oncely,
    sync_engine: sa.Engine,
    fake_provider: FakeProvider,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a loaded machine the server ends a SIGKILLed client's session a moment after the
    child is gone; until then its transaction holds the slot's lock. Here a connection of the
    test holds that lock from the child's death until 0.3 s later, as such a session would:
    the retry still runs the slot, once."""
    import asyncio

    import asyncpg

    from oncely.locks import slot_lock_key
    from oncely.testing import deliver

    crash_in_child = deliver._crash_in_child
    released: list[bool] = []

    async def lingering(target: Any, timeout: float) -> Any:
        crashed = await crash_in_child(target, timeout)
        conn = await asyncpg.connect(db_url)
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", *lock)

        async def end_later() -> None:
            await asyncio.sleep(0.3)
            await conn.close()
            released.append(True)

        asyncio.get_running_loop().create_task(end_later())
        return crashed

    slot = JobSlot(shop_app, "bonus", FRIDAY_1800)
    lock = slot_lock_key("bonus", "2026-11-28T00:00:00Z")
    monkeypatch.setattr(deliver, "_crash_in_child", lingering)
    result = await crash_between_work_and_ack(slot, effects=lambda: fake_provider.applied)
    result.assert_once()
    assert released == [True]  # the retry ran only after the lock was released
    assert result.retry.status == "ran" and shop.payments(sync_engine) == 1
