"""RetryPolicy: what happens after a task's attempt raised, as a pure, testable decision.

`policy.decide(error, attempt, now)` returns `Retry(at)`, `Discard()` or `GiveUp()`; it reads
no clock and no database, and its jitter comes from a seedable random source, so a test can
assert a task's whole retry schedule exactly. The default is the Sidekiq / River consensus:
25 attempts, waiting `attempt**4 + 15` seconds (+/-10 %) after the failed attempt `attempt`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from .errors import ConfigError

Backoff = Literal["polynomial", "exponential", "fixed"]
Wait = int | float | timedelta | Callable[[int], "int | float | timedelta"]

DEFAULT_ATTEMPTS = 25
DEFAULT_WAIT = 15.0
LONGEST_WAIT = 365 * 86400.0
"""No wait exceeds a year, whatever the backoff says (exponential waits overflow dates)."""


@dataclass(frozen=True)
class Retry:
    """Run the task again at `at` (the failed attempt's work was rolled back)."""

    at: datetime
    wait: float
    """Seconds from `now` to `at`."""


@dataclass(frozen=True)
class Discard:
    """Drop the task: the error is in `discard_on` (e.g. the order no longer exists)."""


@dataclass(frozen=True)
class GiveUp:
    """Keep the task as `dead`: attempts are exhausted, or the error is not in `retry_on`."""

    reason: str = "attempts exhausted"


Decision = Retry | Discard | GiveUp


def _seconds(value: int | float | timedelta, what: str) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigError(f"{what} must be seconds (int, float or timedelta), got {value!r}")
    if seconds < 0 or seconds != seconds:
        raise ConfigError(f"{what} must be >= 0 seconds, got {value!r}")
    return seconds


def _error_classes(value: Sequence[type[BaseException]] | None, what: str) -> tuple[type, ...]:
    if value is None:
        return ()
    classes = tuple(value)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise ConfigError(f"{what} must list exception classes, got {cls!r}")
    return classes


class RetryPolicy:
    """How many attempts a task gets, how long to wait between them, and which errors retry.

    `wait` is seconds (int, float, timedelta) or a function `attempt -> seconds`. With a
    number, `backoff` shapes it: "polynomial" waits `attempt**4 + wait`, "exponential"
    `wait * 2**(attempt-1)`, "fixed" `wait`. `jitter=0.1` spreads each wait uniformly within
    +/-10 %; `max_wait` caps it (no wait exceeds a year). If `retry_on` is given only those
    errors retry (others go dead at once); `discard_on` errors are discarded without retry.
    `seed` fixes the jitter.
    """

    def __init__(
        self,
        attempts: int = DEFAULT_ATTEMPTS,
        wait: Wait = DEFAULT_WAIT,
        *,
        backoff: Backoff = "polynomial",
        jitter: float = 0.1,
        max_wait: int | float | timedelta | None = None,
        retry_on: Sequence[type[BaseException]] | None = None,
        discard_on: Sequence[type[BaseException]] | None = None,
        seed: int | None = None,
    ) -> None:
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
            raise ConfigError(f"RetryPolicy attempts must be an int >= 1, got {attempts!r}")
        if backoff not in ("polynomial", "exponential", "fixed"):
            raise ConfigError(
                f"RetryPolicy backoff must be 'polynomial', 'exponential' or 'fixed', "
                f"got {backoff!r}"
            )
        if not isinstance(jitter, (int, float)) or isinstance(jitter, bool):
            raise ConfigError(f"RetryPolicy jitter must be a fraction in [0, 1), got {jitter!r}")
        if not 0 <= jitter < 1:
            raise ConfigError(f"RetryPolicy jitter must be a fraction in [0, 1), got {jitter!r}")
        self.attempts = attempts
        self.backoff: Backoff = backoff
        self.jitter = float(jitter)
        self._wait_func: Callable[[int], int | float | timedelta] | None = None
        self._wait = 0.0
        if callable(wait):
            self._wait_func = wait
        else:
            self._wait = _seconds(wait, "RetryPolicy wait")
        self.max_wait = None if max_wait is None else _seconds(max_wait, "RetryPolicy max_wait")
        self.retry_on = _error_classes(retry_on, "RetryPolicy retry_on")
        self.discard_on = _error_classes(discard_on, "RetryPolicy discard_on")
        self._rng = random.Random(seed)

    def __repr__(self) -> str:
        wait = self._wait_func if self._wait_func is not None else self._wait
        return (
            f"RetryPolicy(attempts={self.attempts}, wait={wait!r}, backoff={self.backoff!r}, "
            f"jitter={self.jitter}, max_wait={self.max_wait})"
        )

    def base_wait(self, attempt: int) -> float:
        """Seconds to wait after failed attempt `attempt` (1-based), before jitter and cap."""
        if self._wait_func is not None:
            return _seconds(self._wait_func(attempt), f"RetryPolicy wait({attempt})")
        if self.backoff == "polynomial":
            return float(attempt**4) + self._wait
        if self.backoff == "exponential":
            return self._wait * 2.0 ** (attempt - 1)
        return self._wait

    def bounds(self, attempt: int) -> tuple[float, float]:
        """The smallest and largest wait the jitter can give after failed attempt `attempt`."""
        base = self.base_wait(attempt)
        cap = LONGEST_WAIT if self.max_wait is None else min(self.max_wait, LONGEST_WAIT)
        return min(base * (1 - self.jitter), cap), min(base * (1 + self.jitter), cap)

    def wait_for(self, attempt: int, rng: random.Random | None = None) -> float:
        """One jittered wait after failed attempt `attempt`, drawn from `rng` (or the policy's)."""
        base = self.base_wait(attempt)
        source = rng if rng is not None else self._rng
        wait = base * (1 + source.uniform(-self.jitter, self.jitter)) if self.jitter else base
        cap = LONGEST_WAIT if self.max_wait is None else min(self.max_wait, LONGEST_WAIT)
        return max(min(wait, cap), 0.0)

    def decide(
        self, error: BaseException, attempt: int, now: datetime, rng: random.Random | None = None
    ) -> Decision:
        """What to do after attempt number `attempt` (1-based) raised `error` at `now`."""
        if self.discard_on and isinstance(error, self.discard_on):
            return Discard()
        if self.retry_on and not isinstance(error, self.retry_on):
            return GiveUp(f"{type(error).__name__} is not in retry_on")
        if attempt >= self.attempts:
            return GiveUp(f"attempts exhausted ({attempt} of {self.attempts})")
        wait = self.wait_for(attempt, rng)
        return Retry(at=now + timedelta(seconds=wait), wait=wait)


DEFAULT_POLICY = RetryPolicy()
"""25 attempts, `attempt**4 + 15` seconds +/-10 % between them."""

SLOT_ATTEMPTS = 5
SLOT_WAIT = 3.0
SLOT_POLICY = RetryPolicy(SLOT_ATTEMPTS, SLOT_WAIT, backoff="exponential", jitter=0.15)
"""A scheduled job's slot without `retry=`: 5 attempts, waiting 3, 6, 12 and 24 s (+/-15 %)
after the failed ones (Active Job's five attempts from 3 s, growing), counted fleet-wide."""
