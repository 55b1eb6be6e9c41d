"""Schedules in words, and the DST changes ahead in a job's zone: what the overview shows."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from ..schedule import CronSchedule, EverySchedule, Schedule

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


def zone_name(schedule: Schedule) -> str:
    zone = schedule.zone
    return zone.key if isinstance(zone, ZoneInfo) else "UTC"


@dataclass(frozen=True)
class Shift:
    """A change of a zone's UTC offset: a `gap` (clocks forward) or a `fold` (back)."""

    at: datetime
    """The instant of the change (UTC)."""
    kind: str
    before: timedelta
    after: timedelta
    slots: tuple[datetime, ...]
    """The job's slots within the shifted hour(s) around it (at most a few)."""
    more: bool


@functools.lru_cache(maxsize=256)
def _changes(zone: ZoneInfo, start: datetime, end: datetime) -> tuple[datetime, ...]:
    """The instants in [start, end) at which `zone`'s offset changes (to the minute); kept
    per zone and hour, as the overview asks for every job on every load."""
    return tuple(_walk(zone, start, end))


def _walk(zone: ZoneInfo, start: datetime, end: datetime) -> Iterator[datetime]:
    step = timedelta(hours=1)
    t = start
    while t < end:
        if t.astimezone(zone).utcoffset() != (t + step).astimezone(zone).utcoffset():
            lo, hi = t, t + step
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    hi = mid
            yield hi.replace(second=0, microsecond=0)
        t += step


def dst_shifts(schedule: Schedule, now: datetime, days: int = 30, show: int = 4) -> list[Shift]:
    """The DST gaps and folds of the schedule's zone in the next `days` days, each with the
    job's slots in the hours the change moves (UTC jobs: none)."""
    zone = schedule.zone
    if not isinstance(zone, ZoneInfo) or zone.key == "UTC":
        return []
    start = now.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    shifts = []
    for at in _changes(zone, start, start + timedelta(days=days)):
        before = (at - timedelta(minutes=1)).astimezone(zone).utcoffset() or timedelta(0)
        after = at.astimezone(zone).utcoffset() or timedelta(0)
        width = abs(after - before)
        slots: list[datetime] = []
        more = False
        for slot in schedule.slots_after(at - width - timedelta(microseconds=1)):
            if slot >= at + width:
                break
            if len(slots) >= show:
                more = True
                break
            slots.append(slot)
        kind = "gap" if after > before else "fold"
        shifts.append(Shift(at, kind, before, after, tuple(slots), more))
    return shifts
