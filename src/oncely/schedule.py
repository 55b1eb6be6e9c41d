"""When a job fires: `cron(...)` and `every(...)`, pure functions of time.

Both kinds answer the same two questions, "the next slot after t" and "the latest slot at or
before t", and every replica that asks them gets the same answers: slots come from the
schedule's nominal times, never from the clock at wake-up.

Cron expressions are evaluated by cronsim, which follows Debian cron across DST changes: a
fixed time that falls in the spring-forward gap fires once, right after the jump; a fixed time
in the fall-back fold fires once, at its first occurrence. Expressions with a wildcard minute
or hour run on elapsed time (every real half hour fires, the repeated hour included).
"""

from __future__ import annotations

import abc
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError

from .errors import BadInputError, ConfigError

UTC = timezone.utc
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A DST shift moves wall time by at most a few hours; looking back this far from a slot that
# cronsim's reverse walk found is enough to meet every slot the forward walk would produce.
_DST_MARGIN = timedelta(hours=3)


MAX_ZONE = 64
"""Characters: the longest time zone name accepted (IANA's longest is 32)."""
_ZONE_NAME = re.compile(r"^[A-Za-z0-9_+\-/]{1,64}$")


def zone_problem(tz: object) -> str | None:
    """Why `tz` is not a time zone oncely can use (None if it is): a str of at most
    `MAX_ZONE` characters naming a known IANA zone."""
    if isinstance(tz, str) and len(tz) > MAX_ZONE:
        return f"time zone {tz[:40]!r}… is longer than {MAX_ZONE} characters: use an IANA name"
    unknown = f"unknown time zone {tz!r:.80} (use an IANA name such as 'America/Mexico_City')"
    if not isinstance(tz, str) or not _ZONE_NAME.match(tz):
        return unknown
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name no file can have
        return unknown
    known = _known_zones()
    if known and tz not in known:  # a file of the zone database that names no zone: posixrules
        return unknown
    return None


@functools.cache
def _known_zones() -> frozenset[str]:
    """The IANA zones this machine knows (its zone database and the tzdata package)."""
    return frozenset(available_timezones())


def default_key(slot: datetime) -> str:
    """A slot's default ledger key: its nominal instant in UTC, ISO-8601 with a `Z`."""
    return slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _aware(t: datetime) -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise BadInputError(f"time {t.isoformat()} has no UTC offset; pass a timezone-aware time")
    return t


class Schedule(abc.ABC):
    """A rule that yields slots: nominal fire times, strictly increasing."""

    @property
    @abc.abstractmethod
    def zone(self) -> ZoneInfo | timezone:
        """The zone slots are expressed in (and handed to jobs in)."""

    @abc.abstractmethod
    def next_after(self, t: datetime) -> datetime | None:
        """The first slot strictly after `t`, in the schedule's zone; None if there is none."""

    @abc.abstractmethod
    def latest_at_or_before(self, t: datetime) -> datetime | None:
        """The last slot at or before `t`, in the schedule's zone; None if there is none."""

    def check(self) -> None:
        """Raise ConfigError if the schedule was declared wrongly (registration calls this)."""
        problem = getattr(self, "_problem", None)
        if problem:
            raise ConfigError(problem)

    @abc.abstractmethod
    def describe(self) -> str:
        """The schedule as a user wrote it, e.g. `cron("0 18 * * FRI", tz="America/…")`."""

    def slots_after(self, t: datetime) -> Iterator[datetime]:
        """Every slot strictly after `t`, in order."""
        current: datetime | None = t
        while current is not None:
            current = self.next_after(current)
            if current is not None:
                yield current

    def slots_between(self, start: datetime, end: datetime) -> Iterator[datetime]:
        """Every slot in the half-open interval (start, end], in order."""
        for slot in self.slots_after(start):
            if slot > end:
                return
            yield slot


@dataclass(frozen=True)
class CronSchedule(Schedule):
    """A 5-field cron expression in an IANA time zone."""

    expr: str
    tz: str = "UTC"
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _problem: str | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        # A bad schedule is recorded, not raised, so that registration can name the job;
        # using it raises ConfigError (see `check`).
        expr = " ".join(str(self.expr).split())
        object.__setattr__(self, "expr", expr)
        object.__setattr__(self, "_zone", ZoneInfo("UTC"))
        object.__setattr__(self, "_problem", self._find_problem())

    def _find_problem(self) -> str | None:
        if len(self.expr.split()) != 5:
            return (
                f"cron expression {self.expr!r} must have 5 fields "
                "(minute hour day-of-month month day-of-week)"
            )
        problem = zone_problem(self.tz)
        if problem is not None:
            return problem
        zone = ZoneInfo(self.tz)
        object.__setattr__(self, "_zone", zone)
        try:
            next(CronSim(self.expr, datetime(2000, 1, 1, tzinfo=zone)))
        except CronSimError as exc:
            return f"bad cron expression {self.expr!r}: {exc}"
        except StopIteration:
            return f"cron expression {self.expr!r} never fires"
        return None

    @property
    def zone(self) -> ZoneInfo:
        self.check()
        return self._zone

    def describe(self) -> str:
        return f'cron("{self.expr}", tz="{self.tz}")'

    def next_after(self, t: datetime) -> datetime | None:
        self.check()
        after = _aware(t).astimezone(UTC)
        # Start a second early so a slot at exactly `t` is seen and then rejected below;
        # cronsim's results are wall times, so compare them as instants.
        it = CronSim(self.expr, (after - timedelta(seconds=1)).astimezone(self._zone))
        try:
            found: datetime | None = None
            for candidate in it:
                if candidate.astimezone(UTC) > after:
                    found = candidate.astimezone(UTC)
                    break
        except (StopIteration, OverflowError):  # cronsim gives up after 50 years / year 9999
            return None
        if found is None:  # pragma: no cover
            return None
        if self._elapsed and self._offset_changes(after, found):
            # cronsim's walk for wildcard minutes/hours steps over wall times when a day
            # boundary meets an offset change (seen in Australia/Lord_Howe): near a change,
            # decide from wall times instead.
            found = self._elapsed_next_after(after) or found
        return found.astimezone(self._zone)

    @property
    def _elapsed(self) -> bool:
        """Whether slots run on elapsed time (a wildcard minute or hour), not Debian's fix-ups."""
        minute, hour = self.expr.split()[:2]
        return self._zone.key != "UTC" and (minute.startswith("*") or hour.startswith("*"))

    def _offset_changes(self, start: datetime, end: datetime) -> bool:
        before = (start - _DST_MARGIN).astimezone(self._zone).utcoffset()
        after = (end + _DST_MARGIN).astimezone(self._zone).utcoffset()
        return before != after or end - start > timedelta(days=7)

    def _elapsed_next_after(self, after: datetime) -> datetime | None:
        """The first instant after `after` whose wall time matches, walking naive wall times.

        A wall time in a gap has no instant; one in a fold has two, and both are slots.
        """
        start = (after - _DST_MARGIN).astimezone(self._zone).replace(tzinfo=None)
        best: datetime | None = None
        best_wall: datetime | None = None
        try:
            for wall in CronSim(self.expr, start):
                if best_wall is not None and wall > best_wall + _DST_MARGIN:
                    break
                for fold in (0, 1):
                    local = wall.replace(tzinfo=self._zone, fold=fold)
                    instant = local.astimezone(UTC)
                    if instant.astimezone(self._zone).replace(tzinfo=None) != wall:
                        continue  # in the spring-forward gap: this wall time never happens
                    if instant > after and (best is None or instant < best):
                        best, best_wall = instant, wall
        except (StopIteration, OverflowError):
            pass
        return best

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        self.check()
        at = _aware(t).astimezone(UTC)
        # cronsim's reverse walk finds a matching slot at or before `t`, but it steps over a
        # gap slot that the forward walk moves past the jump; so use it only as a lower bound
        # and let the forward walk (the one definition of our slots) decide.
        reverse = CronSim(self.expr, (at + timedelta(seconds=1)).astimezone(self._zone), True)
        try:
            lower = next(reverse)
        except StopIteration:
            return None
        best: datetime | None = None
        for slot in self.slots_after(lower.astimezone(UTC) - _DST_MARGIN):
            if slot.astimezone(UTC) > at:
                break
            best = slot
        return best


@dataclass(frozen=True)
class EverySchedule(Schedule):
    """A fixed interval, aligned to the Unix epoch in UTC so every replica agrees."""

    period: timedelta
    _problem: str | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if self.period < timedelta(seconds=1) or self.period % timedelta(seconds=1):
            object.__setattr__(
                self,
                "_problem",
                f"every(...) needs a whole number of seconds, at least 1; got {self.period}",
            )

    @property
    def zone(self) -> timezone:
        return UTC

    def describe(self) -> str:
        return f"every(seconds={int(self.period.total_seconds())})"

    def next_after(self, t: datetime) -> datetime | None:
        self.check()
        n = (_aware(t) - _EPOCH) // self.period
        return _EPOCH + (n + 1) * self.period

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        self.check()
        n = (_aware(t) - _EPOCH) // self.period
        return _EPOCH + n * self.period


def cron(expr: str, tz: str = "UTC") -> CronSchedule:
    """A 5-field cron schedule (names, ranges, steps, `L`, `#`) in an IANA time zone."""
    return CronSchedule(expr, tz)


def every(
    *, seconds: float = 0, minutes: float = 0, hours: float = 0, days: float = 0
) -> EverySchedule:
    """A schedule that fires every given interval, at multiples of it since the Unix epoch."""
    try:
        period = timedelta(seconds=seconds, minutes=minutes, hours=hours, days=days)
    except (TypeError, OverflowError):
        period = timedelta(0)
    return EverySchedule(period)


# -- a schedule in words (the dashboard's and the schedule list's) -------------------------

_DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
_NAMES = {d[:3].upper(): i for i, d in enumerate(_DAYS)}
_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def _every(period: timedelta) -> str:
    seconds = int(period.total_seconds())
    for unit, size in _UNITS:
        if seconds % size == 0:
            n = seconds // size
            return f"every {unit}" if n == 1 else f"every {n} {unit}s"
    return f"every {seconds} seconds"  # pragma: no cover - seconds divide by 1


def _day_names(field: str) -> str | None:
    days = []
    for part in field.split(","):
        if part.isdigit() and int(part) <= 7:
            days.append(_DAYS[int(part) % 7])
        elif part.upper() in _NAMES:
            days.append(_DAYS[_NAMES[part.upper()]])
        else:
            return None
    return ", ".join(days)


def _cron(expr: str) -> str:
    fields = expr.split()
    if len(fields) != 5:
        return expr
    minute, hour, dom, month, dow = fields
    if minute.isdigit() and hour == "*" and dom == month == dow == "*":
        return f"every hour at minute {int(minute)}"
    if minute == "*" and hour == dom == month == dow == "*":
        return "every minute"
    if minute.startswith("*/") and hour == dom == month == dow == "*":
        return f"every {minute[2:]} minutes"
    if not (minute.isdigit() and hour.isdigit()) or month != "*":
        return f"cron {expr}"
    at = f"at {int(hour):02d}:{int(minute):02d}"
    if dom == "*" and dow == "*":
        return f"every day {at}"
    if dom == "*":
        names = _day_names(dow)
        return f"{at} on {names}" if names else f"cron {expr}"
    if dow == "*" and dom.isdigit():
        return f"{at} on day {int(dom)} of every month"
    return f"cron {expr}"


def in_words(schedule: Schedule) -> str:
    """A schedule as a sentence: `every 15 minutes`, `at 18:00 on Friday`; an expression
    with no simple reading is shown as it is (`cron 0 9-17/2 * * MON-FRI`)."""
    if isinstance(schedule, EverySchedule):
        return _every(schedule.period)
    if isinstance(schedule, CronSchedule):
        return _cron(schedule.expr)
    return schedule.describe()
