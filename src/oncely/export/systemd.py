"""systemd: a `.timer` + `.service` pair per job; the timer's `OnCalendar=` is in the job's zone.

`OnCalendar=` ANDs a weekday with a date, so cron's OR becomes two `OnCalendar=` lines (a timer
fires on their union); `L` is `~01`, `LW` is the union of "Mon..Fri ~01" and "Fri ~02/~03",
a last weekday is `~01..07` and the nth weekday is a 7-day date range. Intervals that divide a
minute are written in seconds. systemd skips a wall time in the spring-forward gap and fires a
repeated one once.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..registry import Job
from ..schedule import EverySchedule
from .base import (
    ALL_DAYS,
    ALL_HOURS,
    ALL_MINUTES,
    ALL_MONTHS,
    WEEKDAY_NAMES,
    CronFields,
    DayRule,
    DstModel,
    Export,
    UnsupportedScheduleError,
    command,
    compact,
    cron_fields,
    cron_schedule,
    dst_warning,
    resource_name,
)

TARGET = "systemd"
_NTH = {1: "01..07", 2: "08..14", 3: "15..21", 4: "22..28", 5: "29..31"}
_LAST_WEEKDAY = [("Mon..Fri", "~01"), ("Fri", "~02"), ("Fri", "~03")]


@dataclass(frozen=True)
class Unit:
    """How the service runs `oncely run`."""

    executable: str = "oncely"
    app_spec: str | None = None
    working_directory: str | None = None
    environment_file: str | None = None
    user: str | None = None


def _day_name(monday_first: int) -> str:
    return WEEKDAY_NAMES[(monday_first + 1) % 7].capitalize()


def _weekdays(days: frozenset[int]) -> str:
    """Weekdays (SUN=0) as systemd writes them: ranges run Mon..Sun and never wrap."""
    return compact(((d + 6) % 7 for d in days), "..", _day_name)


def _one_day(d: int) -> str:
    return WEEKDAY_NAMES[d].capitalize()


def _dom_terms(fields: CronFields) -> list[tuple[str | None, str]]:
    terms: list[tuple[str | None, str]] = []
    if fields.days:
        terms.append((None, "-" + _numbers(fields.days, ALL_DAYS)))
    if fields.last_day:
        terms.append((None, "~01"))
    if fields.last_weekday:
        terms.extend(_LAST_WEEKDAY)
    return terms


def _dow_terms(fields: CronFields) -> list[tuple[str | None, str]]:
    terms: list[tuple[str | None, str]] = []
    if fields.weekdays:
        terms.append((_weekdays(fields.weekdays), "-*"))
    for d in sorted(fields.last_weekdays):
        terms.append((_one_day(d), "~01..07"))
    for d, n in sorted(fields.nth_weekdays):
        terms.append((_one_day(d), "-" + _NTH[n]))
    return terms


def _day_terms(job: Job, fields: CronFields) -> list[tuple[str | None, str]]:
    """(weekday, day part) pairs whose union is the job's days."""
    if fields.rule is DayRule.ALL:
        return [(None, "-*")]
    if fields.rule is DayRule.DOM:
        return _dom_terms(fields)
    if fields.rule is DayRule.DOW:
        return _dow_terms(fields)
    if fields.rule is DayRule.OR:
        return _dom_terms(fields) + _dow_terms(fields)
    if fields.dom_special or fields.dow_special:
        raise UnsupportedScheduleError(
            job.name, TARGET, f"{fields.rule.value} with `L`, `LW` or `#`"
        )
    days = "-" + _numbers(fields.days, ALL_DAYS)
    return [(_weekdays(fields.weekdays), days)]


def _numbers(values: frozenset[int], full: frozenset[int]) -> str:
    """A numeric component as a list of values and ranges, never a `start/step` repetition:
    systemd 252 computes those wrongly across days and fails on them in a time zone
    ("Resource deadlock avoided"), where the same values as a list work."""
    return "*" if values == full else compact(values, "..", "{:02d}".format)


def on_calendar(job: Job) -> list[str]:
    """The `OnCalendar=` values whose union fires at exactly the job's slots."""
    schedule = job.schedule
    if isinstance(schedule, EverySchedule):
        seconds = int(schedule.period.total_seconds())
        if 60 % seconds == 0:
            every_n = ",".join(f"{s:02d}" for s in range(0, 60, seconds))
            return [f"*-*-* *:*:{every_n} UTC"]
    cron = cron_schedule(job, TARGET)
    fields = cron_fields(cron.expr)
    month = _numbers(fields.months, ALL_MONTHS)
    hour = _numbers(fields.hours, ALL_HOURS)
    minute = _numbers(fields.minutes, ALL_MINUTES)
    out = []
    for weekday, day in _day_terms(job, fields):
        prefix = f"{weekday} " if weekday else ""
        out.append(f"{prefix}*-{month}{day} {hour}:{minute}:00 {cron.tz}")
    return out


def unit_files(job: Job, unit: Unit) -> dict[str, str]:
    """`{file name: contents}` for the job's timer and service."""
    base = resource_name(job.name, "oncely-", "a-zA-Z0-9:_.-", 200)
    argv = command(job.name, unit.app_spec)
    argv[0] = unit.executable
    service = [
        "[Unit]",
        f"Description=oncely job {job.name} (one slot, then exit)",
        "",
        "[Service]",
        "Type=oneshot",
        f"ExecStart={' '.join(shlex.quote(a) for a in argv).replace('%', '%%')}",
    ]
    if unit.working_directory:
        service.append(f"WorkingDirectory={unit.working_directory}")
    if unit.environment_file:
        service.append(f"EnvironmentFile={unit.environment_file}")
    if unit.user:
        service.append(f"User={unit.user}")
    timer = [
        "[Unit]",
        f"Description=oncely job {job.name}: {job.schedule.describe()}".replace("%", "%%"),
        "",
        "[Timer]",
        *(f"OnCalendar={value}" for value in on_calendar(job)),
        "Persistent=true",
        "AccuracySec=1s",
        f"Unit={base}.service",
        "",
        "[Install]",
        "WantedBy=timers.target",
    ]
    return {f"{base}.service": "\n".join(service) + "\n", f"{base}.timer": "\n".join(timer) + "\n"}


def files_of(result: Export) -> dict[str, str]:
    """The `{file name: contents}` an export produced, whichever its format."""
    data: dict[str, str] = result.data.get("files", result.data)
    return data


def export(jobs: Sequence[Job], unit: Unit, fmt: str, now: datetime) -> Export:
    """The unit files, concatenated with a `# file:` header each, or as one JSON document."""
    files: dict[str, str] = {}
    for job in jobs:
        files.update(unit_files(job, unit))
    warnings = []
    for job in jobs:
        if isinstance(job.schedule, EverySchedule):
            continue
        w = dst_warning(job, cron_schedule(job, TARGET), TARGET, DstModel.WALL_ONCE, now)
        if w:
            warnings.append(w)
    if fmt == "json":
        data: dict[str, Any] = {"files": files}
        return Export(json.dumps(data, indent=2), data, warnings)
    text = "".join(f"# file: {name}\n{body}\n" for name, body in files.items())
    return Export(text, files, warnings)
