"""A clock tests can freeze and move: schedules, slots and retries without sleeping."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import TracebackType

from .. import clock
from ..errors import BadInputError, BadTimeError


def _instant(at: datetime | str) -> datetime:
    try:
        value = datetime.fromisoformat(at) if isinstance(at, str) else at
    except ValueError:
        raise BadTimeError(f"the test clock needs an ISO 8601 time, got {at!r}") from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise BadTimeError(f"the test clock needs an aware time, got {value.isoformat()}")
    return value


class FrozenClock:
    """Time that stands still until the test moves it; oncely reads it while installed.

    ``with FrozenClock("2026-11-27T18:00:00-06:00") as clock: ... clock.advance(minutes=1)``
    makes every `oncely.clock.utcnow()` (the slot an `app.run` picks, SQLite's claim times)
    return the frozen instant. Child processes started by the toolkit inherit it.
    """

    def __init__(self, at: datetime | str | None = None) -> None:
        self._now = _instant(at) if at is not None else datetime.now(timezone.utc)
        self._previous: list[object] = []

    def now(self) -> datetime:
        """The frozen instant, in the zone it was given in."""
        return self._now

    def set(self, at: datetime | str) -> datetime:
        """Jump to `at` (forward or back)."""
        self._now = _instant(at)
        return self._now

    def advance(
        self,
        delta: timedelta | float = 0.0,
        *,
        seconds: float = 0.0,
        minutes: float = 0.0,
        hours: float = 0.0,
        days: float = 0.0,
    ) -> datetime:
        """Move forward by `delta` (a timedelta or seconds) plus the keyword amounts."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        step += timedelta(seconds=seconds, minutes=minutes, hours=hours, days=days)
        if step < timedelta(0):
            raise BadInputError("advance() moves forward; use set() to go back")
        self._now += step
        return self._now

    def install(self) -> None:
        """Make oncely read this clock until `uninstall()`."""
        self._previous.append(clock._source)
        clock.set_source(self.now)

    def uninstall(self) -> None:
        """Give oncely back the clock it read before `install()`."""
        previous = self._previous.pop() if self._previous else None
        clock.set_source(previous)  # type: ignore[arg-type]

    def __enter__(self) -> FrozenClock:
        self.install()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()


def frozen_now() -> datetime | None:
    """The instant of the installed test clock, or None when oncely reads the wall clock."""
    return clock._source() if clock._source is not None else None
