"""An independent evaluator of AWS's 6-field `cron(...)` expressions, for checking exports.

It follows AWS's documented rules, not cronsim's: fields minute hour day-of-month month
day-of-week year; weekdays 1-7 with SUN=1 (or SUN-SAT); exactly one of the two day fields is
`?`; `L` (last day / last <weekday>), `LW`, `nW` (nearest weekday) and `n#k` stand alone in
their field. In a zone, a wall time that does not exist is skipped and one that exists twice
fires once (EventBridge Scheduler's documented DST behaviour).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

UTC = timezone.utc
MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]


class AwsCronError(ValueError):
    pass


def _value(text: str, lo: int, hi: int, names: list[str] | None, base: int) -> int:
    if names and text.upper() in names:
        return names.index(text.upper()) + base
    if not text.isdigit():
        raise AwsCronError(f"bad value {text!r}")
    v = int(text)
    if not lo <= v <= hi:
        raise AwsCronError(f"{v} out of {lo}-{hi}")
    return v


def _set(field: str, lo: int, hi: int, names: list[str] | None = None, base: int = 0) -> set[int]:
    out: set[int] = set()
    for term in field.split(","):
        step = 1
        if "/" in term:
            term, step_text = term.split("/")
            step = int(step_text)
            if step < 1:
                raise AwsCronError("bad step")
        if term == "*":
            a, b = lo, hi
        elif "-" in term:
            left, right = term.split("-")
            a, b = _value(left, lo, hi, names, base), _value(right, lo, hi, names, base)
            if b < a:
                raise AwsCronError("descending range")
        else:
            a = _value(term, lo, hi, names, base)
            b = hi if step != 1 else a
        out.update(range(a, b + 1, step))
    return out


def _last_weekday(d: date) -> int:
    last = calendar.monthrange(d.year, d.month)[1]
    wd = date(d.year, d.month, last).weekday()  # Mon=0 .. Sun=6
    return last - 1 if wd == 5 else last - 2 if wd == 6 else last


def _nearest_weekday(d: date, n: int) -> int:
    last = calendar.monthrange(d.year, d.month)[1]
    if n > last:
        return -1
    wd = date(d.year, d.month, n).weekday()
    if wd == 5:  # Saturday: the Friday before, unless that leaves the month
        return n - 1 if n > 1 else n + 2
    if wd == 6:  # Sunday: the Monday after, unless that leaves the month
        return n + 1 if n < last else n - 2
    return n


def _dom(field: str) -> Callable[[date], bool]:
    if field == "L":
        return lambda d: d.day == calendar.monthrange(d.year, d.month)[1]
    if field == "LW":
        return lambda d: d.day == _last_weekday(d)
    m = re.fullmatch(r"(\d+)W", field)
    if m:
        n = _value(m.group(1), 1, 31, None, 0)
        return lambda d: d.day == _nearest_weekday(d, n)
    if any(c in field for c in "LW#"):
        raise AwsCronError(f"L/W must stand alone in day-of-month: {field!r}")
    days = _set(field, 1, 31)
    return lambda d: d.day in days


def _aws_weekday(d: date) -> int:
    return (d.weekday() + 1) % 7 + 1  # SUN=1 .. SAT=7


def _dow(field: str) -> Callable[[date], bool]:
    m = re.fullmatch(r"(\w+)L", field)
    if m:
        wd = _value(m.group(1), 1, 7, DAYS, 1)
        last = lambda d: d.day + 7 > calendar.monthrange(d.year, d.month)[1]  # noqa: E731
        return lambda d: _aws_weekday(d) == wd and last(d)
    m = re.fullmatch(r"(\w+)#(\d)", field)
    if m:
        wd = _value(m.group(1), 1, 7, DAYS, 1)
        k = int(m.group(2))
        if not 1 <= k <= 5:
            raise AwsCronError("# needs 1-5")
        return lambda d: _aws_weekday(d) == wd and (d.day - 1) // 7 + 1 == k
    if any(c in field for c in "L#"):
        raise AwsCronError(f"L/# must stand alone in day-of-week: {field!r}")
    days = _set(field, 1, 7, DAYS, 1)
    return lambda d: _aws_weekday(d) in days


class AwsCron:
    """A parsed `cron(...)` expression."""

    def __init__(self, expression: str) -> None:
        m = re.fullmatch(r"cron\((.*)\)", expression)
        if not m:
            raise AwsCronError(f"not a cron(...) expression: {expression!r}")
        fields = m.group(1).split()
        if len(fields) != 6:
            raise AwsCronError("AWS cron has 6 fields")
        minute, hour, dom, month, dow, year = fields
        if (dom == "?") == (dow == "?"):
            raise AwsCronError("exactly one of day-of-month and day-of-week must be '?'")
        self.minutes = sorted(_set(minute, 0, 59))
        self.hours = sorted(_set(hour, 0, 23))
        self.months = _set(month, 1, 12, MONTHS, 1)
        self.years = _set(year, 1970, 2199)
        self.day = _dom(dom) if dow == "?" else _dow(dow)

    def matches_day(self, d: date) -> bool:
        return d.year in self.years and d.month in self.months and self.day(d)

    def fires(self, zone: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
        """The UTC instants in (start, end] at which EventBridge Scheduler invokes the target."""
        out = []
        d = (start.astimezone(zone) - timedelta(days=1)).date()
        while d <= (end.astimezone(zone) + timedelta(days=1)).date():
            if self.matches_day(d):
                for h in self.hours:
                    for mi in self.minutes:
                        wall = datetime(d.year, d.month, d.day, h, mi)
                        t = wall.replace(tzinfo=zone).astimezone(UTC)  # fold=0: first
                        exists = t.astimezone(zone).replace(tzinfo=None) == wall
                        if exists and start < t <= end:
                            out.append(t)
            d += timedelta(days=1)
        return sorted(out)
