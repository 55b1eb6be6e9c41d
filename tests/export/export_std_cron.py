"""An independent evaluator of plain 5-field cron as robfig/cron (Kubernetes) reads it.

Lists, ranges and steps of numbers; weekdays 0-6 with SUN=0; day-of-month and day-of-week
are ANDed when either field is exactly `*`, else ORed. Wall times are matched in UTC.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

UTC = timezone.utc


def _set(field: str, lo: int, hi: int) -> set[int]:
    out: set[int] = set()
    for term in field.split(","):
        step = 1
        if "/" in term:
            term, step_text = term.split("/")
            step = int(step_text)
        if term == "*":
            a, b = lo, hi
        elif "-" in term:
            a, b = (int(x) for x in term.split("-"))
        else:
            a = b = int(term)
        assert lo <= a <= b <= hi, (field, lo, hi)
        out.update(range(a, b + 1, step))
    return out


def fires(expr: str, start: datetime, end: datetime) -> list[datetime]:
    """UTC instants in (start, end] matching `expr` (read in UTC)."""
    minute, hour, dom, month, dow = expr.split()
    minutes, hours = _set(minute, 0, 59), _set(hour, 0, 23)
    doms, months, dows = _set(dom, 1, 31), _set(month, 1, 12), _set(dow, 0, 6)
    both = dom != "*" and dow != "*"
    out = []
    d = start.date()
    while d <= end.date():
        dom_ok, dow_ok = d.day in doms, (d.weekday() + 1) % 7 in dows
        day_ok = (dom_ok or dow_ok) if both else (dom_ok and dow_ok)
        if d.month in months and day_ok:
            for h in sorted(hours):
                for m in sorted(minutes):
                    t = datetime(d.year, d.month, d.day, h, m, tzinfo=UTC)
                    if start < t <= end:
                        out.append(t)
        d += timedelta(days=1)
    return out
