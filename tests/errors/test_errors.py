"""Every exception oncely raises to users derives from OncelyError (and keeps its builtin)."""

from __future__ import annotations

from datetime import datetime

import pytest
import sqlalchemy as sa

from oncely import OncelyError, logs
from oncely.errors import BadOptionError, BadTimeError, FakeProviderError, RetryDecisionError
from oncely.store.tables import UTCDateTime
from oncely.testing.clock import FrozenClock
from oncely.testing.provider import ENV, FakeProvider
from oncely.testing.retry import as_decider


def test_a_naive_time_for_the_ledger_is_a_bad_time_error() -> None:
    bind = UTCDateTime().process_bind_param
    with pytest.raises(BadTimeError, match="timezone-aware") as raised:
        bind(datetime(2026, 5, 29, 18, 0), sa.create_engine("sqlite://").dialect)
    assert isinstance(raised.value, OncelyError) and isinstance(raised.value, ValueError)


@pytest.mark.parametrize("text", ["Friday at six", "2026-05-29T18:00:00"])
def test_the_test_clock_refuses_a_bad_time_with_a_bad_time_error(text: str) -> None:
    with pytest.raises(BadTimeError) as raised:
        FrozenClock(text)
    assert isinstance(raised.value, OncelyError) and isinstance(raised.value, ValueError)


def test_an_unknown_log_format_is_a_bad_option_error() -> None:
    with pytest.raises(BadOptionError, match="log format must be one of") as raised:
        logs.configure("info", "xml")
    assert isinstance(raised.value, OncelyError) and isinstance(raised.value, ValueError)


def test_an_unreadable_retry_policy_is_a_retry_decision_error() -> None:
    with pytest.raises(RetryDecisionError, match="has no decide") as raised:
        as_decider(42)
    assert isinstance(raised.value, OncelyError) and isinstance(raised.value, TypeError)


def test_a_fake_provider_without_its_fixture_is_a_fake_provider_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(FakeProviderError, match="fake_provider fixture") as raised:
        FakeProvider.from_env()
    assert isinstance(raised.value, OncelyError) and isinstance(raised.value, RuntimeError)
