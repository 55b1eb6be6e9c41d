"""Assertions about a retry policy: which errors retry, how often, how long each wait is.

The helpers speak to a policy through one small shape: `decide(error, attempt[, now])` where
`attempt` is the number of the attempt that just failed (1 for the first), answered with a
`Decision` — retry after `wait`, discard, or give up. `as_decider` adapts a policy object
(anything with a `decide` method whose answers carry a `wait`, a `delay` or an `at`, or are
named Retry / Discard / GiveUp) or a plain function to that shape.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from ..errors import RetryDecisionError
from .clock import FrozenClock

EPOCH = datetime(2030, 1, 1, tzinfo=timezone.utc)
"""The frozen time decisions are asked at, so an absolute `at` becomes a wait."""


class Kind(str, enum.Enum):
    """What a policy decided after a failed attempt."""

    RETRY = "retry"
    DISCARD = "discard"
    GIVE_UP = "give_up"


@dataclass(frozen=True)
class Decision:
    """A policy's answer for one failed attempt, normalised."""

    kind: Kind
    wait: timedelta | None = None
    """For RETRY: how long until the next attempt."""


Decider = Callable[[BaseException, int], Decision]


def _seconds(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


def normalize(answer: Any) -> Decision:
    """A Decision from whatever a policy's `decide` returned."""
    if isinstance(answer, Decision):
        return answer
    name = type(answer).__name__.lower().replace("_", "")
    for attr in ("wait", "delay"):
        value = getattr(answer, attr, None)
        if value is not None:
            return Decision(Kind.RETRY, _seconds(value))
    at = getattr(answer, "at", None)
    if isinstance(at, datetime):
        return Decision(Kind.RETRY, at - EPOCH)
    if "discard" in name:
        return Decision(Kind.DISCARD)
    if "giveup" in name or "dead" in name or "exhaust" in name:
        return Decision(Kind.GIVE_UP)
    raise RetryDecisionError(f"cannot read a retry decision from {answer!r}")


def _takes_now(decide: Callable[..., Any]) -> bool:
    try:
        inspect.signature(decide).bind(BaseException(), 1, EPOCH)
    except TypeError:
        return False
    except ValueError:  # no signature to read: assume the two-argument shape
        return False
    return True


def as_decider(policy: Any) -> Decider:
    """The policy as `decide(error, attempt) -> Decision`, asked at a frozen instant.

    A `decide(error, attempt, now)` (oncely's RetryPolicy) is handed the frozen instant.
    """
    decide = getattr(policy, "decide", policy)
    if not callable(decide):
        raise RetryDecisionError(f"{policy!r} has no decide(error, attempt) and is not callable")
    takes_now = _takes_now(decide)

    def decider(error: BaseException, attempt: int) -> Decision:
        with FrozenClock(EPOCH):
            answer = decide(error, attempt, EPOCH) if takes_now else decide(error, attempt)
        return normalize(answer)

    return decider


def retry_schedule(policy: Any, error: BaseException, *, limit: int = 1000) -> list[Decision]:
    """The decisions for `error` failing on attempt 1, 2, … until the policy stops retrying."""
    decide = as_decider(policy)
    decisions: list[Decision] = []
    for attempt in range(1, limit + 1):
        decision = decide(error, attempt)
        decisions.append(decision)
        if decision.kind is not Kind.RETRY:
            return decisions
    raise AssertionError(f"{error!r} is still retried after {limit} attempts")


def assert_retries(policy: Any, error: BaseException, *, attempts: int) -> None:
    """Fail unless `error` is retried and the task gets exactly `attempts` attempts in all."""
    decisions = retry_schedule(policy, error, limit=attempts + 1)
    kinds = [d.kind.value for d in decisions]
    expected = [Kind.RETRY.value] * (attempts - 1) + [Kind.GIVE_UP.value]
    if kinds != expected:
        raise AssertionError(
            f"{type(error).__name__}: expected {attempts} attempts (retry x{attempts - 1}, "
            f"then give up), the policy decided {kinds}"
        )


def assert_discards(policy: Any, error: BaseException) -> None:
    """Fail unless `error` is discarded at once (no retry, not kept as dead)."""
    decision = as_decider(policy)(error, 1)
    if decision.kind is not Kind.DISCARD:
        raise AssertionError(
            f"{type(error).__name__}: expected discard on the first failure, got {decision}"
        )


def assert_not_retried(policy: Any, error: BaseException) -> None:
    """Fail unless the first failure with `error` is final (discarded or given up)."""
    decision = as_decider(policy)(error, 1)
    if decision.kind is Kind.RETRY:
        raise AssertionError(f"{type(error).__name__}: expected no retry, got {decision}")


Bound = tuple[float | timedelta, float | timedelta]


def assert_waits(
    policy: Any, error: BaseException, bounds: Sequence[Bound], *, samples: int = 200
) -> list[tuple[timedelta, timedelta]]:
    """Fail unless the wait after failed attempt i lies within `bounds[i-1]`, every time.

    Each attempt is asked `samples` times, so jitter gets its chance to leave the bounds.
    Returns the (smallest, largest) wait seen per attempt, to tighten bounds with.
    """
    decide = as_decider(policy)
    seen: list[tuple[timedelta, timedelta]] = []
    for attempt, (low, high) in enumerate(bounds, start=1):
        lo, hi = _seconds(low), _seconds(high)
        waits = []
        for _ in range(samples):
            decision = decide(error, attempt)
            if decision.kind is not Kind.RETRY or decision.wait is None:
                raise AssertionError(
                    f"{type(error).__name__}: attempt {attempt} is not retried ({decision})"
                )
            waits.append(decision.wait)
        smallest, largest = min(waits), max(waits)
        if smallest < lo or largest > hi:
            raise AssertionError(
                f"{type(error).__name__}: the wait after attempt {attempt} ranged "
                f"{smallest.total_seconds():g}s..{largest.total_seconds():g}s, outside "
                f"{lo.total_seconds():g}s..{hi.total_seconds():g}s"
            )
        seen.append((smallest, largest))
    return seen
