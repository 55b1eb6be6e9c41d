"""The retry-policy assertions, against a small policy written here (the task queue's
RetryPolicy plugs into the same shape), including the cases where they must fail."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest

from oncely import clock
from oncely.testing import (
    Decision,
    Kind,
    as_decider,
    assert_discards,
    assert_not_retried,
    assert_retries,
    assert_waits,
    retry_schedule,
)


class GatewayTimeout(Exception):
    pass


class OrderGone(Exception):
    pass


class Unexpected(Exception):
    pass


@dataclass(frozen=True)
class Retry:
    at: datetime


@dataclass(frozen=True)
class Discard:
    pass


@dataclass(frozen=True)
class GiveUp:
    pass


@dataclass
class ExamplePolicy:
    """attempts in all; wait * 2**(attempt-1) seconds, +/- jitter (a fraction)."""

    attempts: int = 5
    wait: float = 3.0
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] = (GatewayTimeout,)
    discard_on: tuple[type[BaseException], ...] = (OrderGone,)

    def decide(self, error: BaseException, attempt: int) -> Retry | Discard | GiveUp:
        if isinstance(error, self.discard_on):
            return Discard()
        if not isinstance(error, self.retry_on) or attempt >= self.attempts:
            return GiveUp()
        base = self.wait * 2 ** (attempt - 1)
        wait = base * (1 + random.uniform(-self.jitter, self.jitter))
        return Retry(clock.utcnow() + timedelta(seconds=wait))


POLICY = ExamplePolicy()


def test_the_declared_policy_holds() -> None:
    assert_retries(POLICY, GatewayTimeout(), attempts=5)
    assert_discards(POLICY, OrderGone())
    assert_not_retried(POLICY, Unexpected())
    seen = assert_waits(
        POLICY, GatewayTimeout(), [(2.7, 3.3), (5.4, 6.6), (10.8, 13.2), (21.6, 26.4)]
    )
    assert len(seen) == 4 and seen[0][0] < seen[0][1]  # jitter was exercised


def test_schedule_lists_each_decision() -> None:
    kinds = [d.kind for d in retry_schedule(ExamplePolicy(attempts=3), GatewayTimeout())]
    assert kinds == [Kind.RETRY, Kind.RETRY, Kind.GIVE_UP]


def test_a_wrong_attempt_count_fails() -> None:
    with pytest.raises(AssertionError, match="expected 4 attempts"):
        assert_retries(POLICY, GatewayTimeout(), attempts=4)
    with pytest.raises(AssertionError, match="expected 5 attempts"):
        assert_retries(POLICY, Unexpected(), attempts=5)


def test_waits_outside_the_bounds_fail() -> None:
    with pytest.raises(AssertionError, match="after attempt 2 ranged"):
        assert_waits(POLICY, GatewayTimeout(), [(2.7, 3.3), (5.9, 6.1)])
    jitterless = ExamplePolicy(jitter=0.0)
    assert_waits(jitterless, GatewayTimeout(), [(3, 3), (6, 6)], samples=3)
    more_jitter = ExamplePolicy(jitter=0.5)
    with pytest.raises(AssertionError, match="after attempt 1 ranged"):
        assert_waits(more_jitter, GatewayTimeout(), [(2.7, 3.3)])


def test_discard_and_no_retry_fail_when_the_policy_retries() -> None:
    with pytest.raises(AssertionError, match="expected discard"):
        assert_discards(POLICY, GatewayTimeout())
    with pytest.raises(AssertionError, match="expected no retry"):
        assert_not_retried(POLICY, GatewayTimeout())
    with pytest.raises(AssertionError, match="attempt 1 is not retried"):
        assert_waits(POLICY, OrderGone(), [(0, 100)])


def test_a_plain_function_and_wait_answers_are_accepted() -> None:
    def decide(error: BaseException, attempt: int) -> Decision:
        return (
            Decision(Kind.RETRY, timedelta(seconds=attempt))
            if attempt < 3
            else Decision(Kind.GIVE_UP)
        )

    assert_retries(decide, GatewayTimeout(), attempts=3)
    assert as_decider(decide)(GatewayTimeout(), 2).wait == timedelta(seconds=2)

    @dataclass
    class Later:
        delay: float

    assert as_decider(lambda e, a: Later(1.5))(GatewayTimeout(), 1).wait == timedelta(seconds=1.5)
    with pytest.raises(TypeError, match="cannot read a retry decision"):
        as_decider(lambda e, a: 42)(GatewayTimeout(), 1)


@dataclass(frozen=True)
class RetryWithWait:
    at: datetime
    wait: float


class PolicyTakingNow:
    """The shape of oncely's RetryPolicy: decide(error, attempt, now), pure, no clock read."""

    def decide(self, error: BaseException, attempt: int, now: datetime) -> object:
        if isinstance(error, OrderGone):
            return Discard()
        if attempt >= 3:
            return GiveUp()
        return RetryWithWait(now + timedelta(seconds=10 * attempt), 10.0 * attempt)


def test_a_policy_that_is_handed_now() -> None:
    policy = PolicyTakingNow()
    assert_retries(policy, GatewayTimeout(), attempts=3)
    assert_discards(policy, OrderGone())
    assert_waits(policy, GatewayTimeout(), [(10, 10), (20, 20)], samples=2)
    with pytest.raises(AssertionError, match=r"ranged 20s\.\.20s"):
        assert_waits(policy, GatewayTimeout(), [(10, 10), (5, 15)], samples=2)


def test_the_assertions_on_oncelys_own_retry_policy() -> None:
    """The article's charge_order policy, asserted with the toolkit on the real RetryPolicy."""
    from oncely import RetryPolicy

    policy = RetryPolicy(
        attempts=5,
        wait=3,
        backoff="fixed",
        jitter=0.1,
        retry_on=[GatewayTimeout],
        discard_on=[OrderGone],
    )
    assert_retries(policy, GatewayTimeout(), attempts=5)
    assert_discards(policy, OrderGone())
    assert_not_retried(policy, KeyError("not in retry_on"))
    assert_waits(policy, GatewayTimeout(), [(2.7, 3.3)] * 4)
    with pytest.raises(AssertionError):
        assert_retries(policy, GatewayTimeout(), attempts=6)  # a refactor that retried once more
    with pytest.raises(AssertionError):
        assert_waits(policy, GatewayTimeout(), [(2.9, 3.1)])  # jitter leaves a too-tight bound
    with pytest.raises(AssertionError):
        assert_discards(policy, GatewayTimeout())
