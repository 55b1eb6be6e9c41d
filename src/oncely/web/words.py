"""Schedules in words, and the DST changes ahead in a job's zone: what the overview shows."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from ..schedule import Schedule, in_words

__all__ = ["Shift", "dst_shifts", "in_words", "zone_name"]


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
