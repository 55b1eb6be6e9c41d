"""FakeProvider: honours idempotency keys, counts applied effects, fails before/after applying."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from oncely.testing import FakeProvider, ProviderError


def test_a_repeated_key_is_applied_once_and_replays_the_first_response(
    fake_provider: FakeProvider,
) -> None:
    first = fake_provider.charge(1000, idempotency_key="k1")
    again = fake_provider.charge(1000, idempotency_key="k1")
    other = fake_provider.charge(1000, idempotency_key="k2")
    assert again == {**first, "replayed": True} and not first["replayed"]
    assert other["id"] != first["id"]
    assert fake_provider.applied == 2 and fake_provider.calls == 3


def test_without_a_key_every_call_applies(fake_provider: FakeProvider) -> None:
    fake_provider.send_email("ana@example.com", "You're top 3!")
    fake_provider.send_email("ana@example.com", "You're top 3!")
    assert fake_provider.applied == 2
    with pytest.raises(AssertionError, match="expected 1 applied effect"):
        fake_provider.assert_applied(1)


def test_fail_after_apply_applies_then_raises(fake_provider: FakeProvider) -> None:
    fake_provider.fail_after_apply()
    with pytest.raises(ProviderError, match="after applying"):
        fake_provider.charge(1000, idempotency_key="k")
    assert fake_provider.applied == 1
    # The client's retry with the same key is not applied again.
    assert fake_provider.charge(1000, idempotency_key="k")["replayed"] is True
    fake_provider.assert_applied(1)


def test_fail_before_apply_applies_nothing(fake_provider: FakeProvider) -> None:
    fake_provider.fail_before_apply(times=2)
    for _ in range(2):
        with pytest.raises(ProviderError, match="before applying"):
            fake_provider.charge(1000, idempotency_key="k")
    assert fake_provider.applied == 0
    fake_provider.charge(1000, idempotency_key="k")
    assert [e.idempotency_key for e in fake_provider.effects()] == ["k"]


def _charge_in_child(path: str) -> None:
    FakeProvider(path).charge(1, idempotency_key="same")


def test_processes_share_one_provider(tmp_path: Path) -> None:
    provider = FakeProvider(tmp_path / "p.db")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_charge_in_child, args=(str(provider.path),)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert provider.calls == 4 and provider.applied == 1
    assert provider.effects()[0].pid != multiprocessing.current_process().pid
    provider.reset()
    assert provider.calls == 0
