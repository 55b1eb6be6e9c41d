"""Guarantee 7: retries follow the declared policy exactly (a pure object, no database)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncely import ConfigError, Discard, GiveUp, Retry, RetryPolicy

NOW = datetime(2026, 11, 27, 18, 0, tzinfo=timezone.utc)


class GatewayTimeout(Exception):
    pass


class OrderGone(Exception):
    pass


def test_retries_follow_the_policy_default_is_sidekiq_river() -> None:
    policy = RetryPolicy()
    assert policy.attempts == 25
    assert [policy.base_wait(a) for a in (1, 2, 3, 10)] == [16.0, 31.0, 96.0, 10015.0]
    for attempt in range(1, 25):
        decision = policy.decide(RuntimeError("x"), attempt, NOW)
        assert isinstance(decision, Retry)
        low, high = policy.bounds(attempt)
        assert low == pytest.approx((attempt**4 + 15) * 0.9)
        assert high == pytest.approx((attempt**4 + 15) * 1.1)
        assert low <= decision.wait <= high
        assert decision.at == NOW + timedelta(seconds=decision.wait)
    assert isinstance(policy.decide(RuntimeError("x"), 25, NOW), GiveUp)


def test_retries_follow_the_policy_exact_schedule_with_a_seed() -> None:
    """The same seed gives the same schedule, so a user can assert it exactly."""
    policy = RetryPolicy(attempts=5, wait=3, backoff="exponential", seed=42)
    schedule = [policy.decide(GatewayTimeout(), a, NOW) for a in range(1, 6)]
    expected_rng = random.Random(42)
    expected = [3 * 2 ** (a - 1) * (1 + expected_rng.uniform(-0.1, 0.1)) for a in range(1, 5)]
    waits = [d.wait for d in schedule[:4] if isinstance(d, Retry)]
    assert waits == pytest.approx(expected)
    assert isinstance(schedule[4], GiveUp)
    again = RetryPolicy(attempts=5, wait=3, backoff="exponential", seed=42)
    assert [again.decide(GatewayTimeout(), a, NOW) for a in range(1, 6)] == schedule
    # And an explicit random source overrides the policy's own.
    one = policy.decide(GatewayTimeout(), 1, NOW, rng=random.Random(7))
    two = policy.decide(GatewayTimeout(), 1, NOW, rng=random.Random(7))
    assert one == two


def test_retries_follow_the_policy_backoffs_and_caps() -> None:
    assert RetryPolicy(wait=5, backoff="fixed", jitter=0).decide(RuntimeError(), 7, NOW) == Retry(
        at=NOW + timedelta(seconds=5), wait=5.0
    )
    exp = RetryPolicy(wait=timedelta(seconds=2), backoff="exponential", jitter=0)
    assert [exp.base_wait(a) for a in (1, 2, 3, 4)] == [2, 4, 8, 16]
    capped = RetryPolicy(wait=10, backoff="exponential", jitter=0.1, max_wait=60, seed=1)
    assert all(capped.wait_for(a) <= 60 for a in range(1, 20))
    assert capped.bounds(10) == (60, 60)
    # However steep the backoff, a wait stays a date (a year at most).
    steep = RetryPolicy(attempts=100, wait=469, backoff="exponential", jitter=0)
    assert steep.decide(RuntimeError(), 60, NOW) == Retry(
        at=NOW + timedelta(days=365), wait=365 * 86400.0
    )
    custom = RetryPolicy(wait=lambda attempt: attempt * 1.5, jitter=0)
    assert [custom.wait_for(a) for a in (1, 2, 3)] == [1.5, 3.0, 4.5]


def test_retries_follow_the_policy_retry_on_and_discard_on() -> None:
    policy = RetryPolicy(attempts=5, retry_on=[GatewayTimeout], discard_on=[OrderGone])
    assert isinstance(policy.decide(GatewayTimeout(), 1, NOW), Retry)
    assert policy.decide(OrderGone(), 1, NOW) == Discard()
    other = policy.decide(ValueError("bad"), 1, NOW)
    assert isinstance(other, GiveUp) and "retry_on" in other.reason
    # discard_on wins even when the error is also retryable; subclasses match.
    both = RetryPolicy(retry_on=[Exception], discard_on=[OrderGone])
    assert both.decide(type("Gone2", (OrderGone,), {})(), 1, NOW) == Discard()
    exhausted = policy.decide(GatewayTimeout(), 5, NOW)
    assert isinstance(exhausted, GiveUp) and "exhausted" in exhausted.reason


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"attempts": 2.5},
        {"wait": -1},
        {"wait": "soon"},
        {"backoff": "linear"},
        {"jitter": 1.5},
        {"jitter": -0.1},
        {"max_wait": -3},
        {"retry_on": [ValueError, "TimeoutError"]},
        {"discard_on": [42]},
    ],
)
def test_bad_input_gets_a_clear_error_bad_retry_policy(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@given(
    attempt=st.integers(1, 30),
    jitter=st.floats(0, 0.99),
    wait=st.floats(0, 10_000),
    backoff=st.sampled_from(["polynomial", "exponential", "fixed"]),
    seed=st.integers(),
)
def test_retries_follow_the_policy_wait_always_within_bounds(
    attempt: int, jitter: float, wait: float, backoff: str, seed: int
) -> None:
    policy = RetryPolicy(attempts=31, wait=wait, backoff=backoff, jitter=jitter, seed=seed)  # type: ignore[arg-type]
    decision = policy.decide(RuntimeError(), attempt, NOW)
    assert isinstance(decision, Retry)
    low, high = policy.bounds(attempt)
    assert low - 1e-6 <= decision.wait <= high + 1e-6
