"""What every export target shares: the job's cron fields as exact sets, the refusal error,
and the DST comparison that turns "the target's clock rules differ" into a warning.

A target never re-parses the user's cron text. It reads the sets cronsim itself evaluates
(`CronFields`), so whatever it writes means exactly what oncely runs, or it refuses, naming
the job, the target and the construct it cannot say.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from enum import Enum
from typing import Any
from zoneinfo import ZoneInfo

from cronsim import CronSim

from ..errors import ConfigError
from ..registry import Job
from ..schedule import CronSchedule, EverySchedule

UTC = timezone.utc
ALL_MINUTES = frozenset(range(60))
ALL_HOURS = frozenset(range(24))
ALL_DAYS = frozenset(range(1, 32))
ALL_MONTHS = frozenset(range(1, 13))
ALL_WEEKDAYS = frozenset(range(7))
WEEKDAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


class UnsupportedScheduleError(ConfigError):
    """An export target cannot express a job's schedule exactly; the message names which part."""

    def __init__(self, job: str, target: str, construct: str, hint: str = "") -> None:
        self.job, self.target, self.construct = job, target, construct
        message = f"job {job!r}: {target} cannot express {construct}"
        super().__init__(f"{message}; {hint}" if hint else message)


class DayRule(Enum):
    """How day-of-month and day-of-week combine, after cronsim's (Debian's) rule."""

    ALL = "every day"
    DOM = "day-of-month only"
    DOW = "day-of-week only"
    AND = "day-of-month AND day-of-week"
    OR = "day-of-month OR day-of-week"


@dataclass(frozen=True)
class CronFields:
    """A 5-field cron expression as the sets cronsim matches against (weekdays 0-6, SUN=0)."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    last_day: bool
    last_weekday: bool
    months: frozenset[int]
    weekdays: frozenset[int]
    last_weekdays: frozenset[int]
    nth_weekdays: frozenset[tuple[int, int]]
    rule: DayRule
    _sim: CronSim = field(repr=False, compare=False)

    @property
    def dom_special(self) -> bool:
        return self.last_day or self.last_weekday

    @property
    def dow_special(self) -> bool:
        return bool(self.last_weekdays or self.nth_weekdays)

    def matches_day(self, d: date) -> bool:
        """Whether cronsim fires on this calendar date (hours and minutes aside)."""
        return d.month in self.months and bool(self._sim.match_day(d))

    def matches(self, wall: datetime) -> bool:
        """Whether a wall time (naive, to the minute) matches every field."""
        return wall.minute in self.minutes and wall.hour in self.hours and self.matches_day(wall)


def cron_fields(expr: str) -> CronFields:
    """Read a 5-field expression the way cronsim evaluates it."""
    sim = CronSim(expr, datetime(2000, 1, 1))
    days = {d for d in sim.days if d > 0}
    weekdays: set[int] = set()
    last_weekdays: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for item in sim.weekdays:
        if isinstance(item, int):
            weekdays.add(item % 7)
        elif item[1] == CronSim.LAST:
            last_weekdays.add(item[0] % 7)
        else:
            nth.add((item[0] % 7, item[1]))
    dom_all = frozenset(days) >= ALL_DAYS
    dow_all = frozenset(weekdays) >= ALL_WEEKDAYS
    if sim.day_and:
        rule = (
            DayRule.ALL
            if dom_all and dow_all
            else DayRule.DOW
            if dom_all
            else DayRule.DOM
            if dow_all
            else DayRule.AND
        )
    else:
        rule = DayRule.ALL if dom_all or dow_all else DayRule.OR
    return CronFields(
        minutes=frozenset(sim.minutes),
        hours=frozenset(sim.hours),
        days=frozenset(days),
        last_day=CronSim.LAST in sim.days,
        last_weekday=CronSim.LAST_WEEKDAY in sim.days,
        months=frozenset(sim.months),
        weekdays=frozenset(weekdays),
        last_weekdays=frozenset(last_weekdays),
        nth_weekdays=frozenset(nth),
        rule=rule,
        _sim=sim,
    )


def runs(values: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted values as maximal runs of consecutive numbers: [(first, last), ...]."""
    out: list[tuple[int, int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def compact(
    values: Iterable[int],
    sep: str = "-",
    name: Callable[[int], str] = str,
) -> str:
    """A set as a list of ranges, e.g. {1,2,3,5} -> '1-3,5' (runs of two stay a list)."""
    terms: list[str] = []
    for first, last in runs(values):
        if last - first >= 2:
            terms.append(f"{name(first)}{sep}{name(last)}")
        else:
            terms.extend(name(v) for v in range(first, last + 1))
    return ",".join(terms)


def progression(values: Iterable[int], hi: int) -> tuple[int, int] | None:
    """(start, step) when the values are start, start+step, ... to the field's end `hi`.

    Such a set is what a step term (`*/15`, `0/15`, `10-59/20`) means in every cron dialect;
    at least three values and a step of 2 or more, else a list says it as briefly.
    """
    ordered = sorted(set(values))
    if len(ordered) < 3 or ordered[1] - ordered[0] < 2:
        return None
    step = ordered[1] - ordered[0]
    return (ordered[0], step) if ordered == list(range(ordered[0], hi + 1, step)) else None


def interval_as_cron(job: Job, target: str, every: EverySchedule) -> CronSchedule:
    """An interval as the UTC cron expression with exactly the same slots, or a refusal.

    every(...) slots are multiples of the period since the Unix epoch in UTC; a cron field
    can say that only when the period divides the next larger unit (a minute step that
    divides an hour, an hour step that divides a day, or one day).
    """
    seconds = int(every.period.total_seconds())
    if seconds % 60 == 0 and 3600 % seconds == 0:
        step = seconds // 60
        return CronSchedule(("*" if step == 1 else f"*/{step}") + " * * * *", "UTC")
    if seconds % 3600 == 0 and 86400 % seconds == 0:
        step = seconds // 3600
        return CronSchedule("0 " + ("*" if step == 1 else f"*/{step}") + " * * *", "UTC")
    raise UnsupportedScheduleError(
        job.name,
        target,
        f"{every.describe()}",
        "its slots are multiples of the period since 1970-01-01T00:00Z, which only a "
        "period dividing an hour (in whole minutes) or a day (in whole hours) can match; "
        "run it with the embedded worker (`oncely worker`) instead",
    )


def cron_schedule(job: Job, target: str) -> CronSchedule:
    """The job's schedule as a cron schedule (intervals translated exactly, or refused)."""
    schedule = job.schedule
    if isinstance(schedule, CronSchedule):
        return schedule
    if isinstance(schedule, EverySchedule):
        return interval_as_cron(job, target, schedule)
    raise UnsupportedScheduleError(job.name, target, f"the schedule {schedule.describe()}")


# -- DST: how a target's clock rules differ from oncely's ---------------------------------------


class DstModel(Enum):
    """How an external scheduler maps cron wall times to instants when the offset changes."""

    # A wall time that does not exist is skipped; one that exists twice fires once (the first).
    WALL_ONCE = "wall-once"
    # Fires at every instant whose local wall time matches: skips the gap, repeats the fold.
    ELAPSED = "elapsed"


def _transitions(zone: ZoneInfo, start: datetime, years: int) -> Iterator[datetime]:
    """The UTC instants (to the minute) at which the zone's offset changes."""
    t = start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    end = t + timedelta(days=366 * years)
    step = timedelta(days=1)
    while t < end:
        nxt = t + step
        if t.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            lo, hi = t, nxt
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                mid = mid.replace(second=0, microsecond=0)
                if mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    hi = mid
            yield hi
        t = nxt


def model_slots(
    fields: CronFields, zone: ZoneInfo, model: DstModel, start: datetime, end: datetime
) -> list[datetime]:
    """The instants in (start, end] at which a scheduler following `model` fires."""
    out: set[datetime] = set()
    day = (start.astimezone(zone) - timedelta(days=1)).date()
    last = (end.astimezone(zone) + timedelta(days=1)).date()
    while day <= last:
        if fields.matches_day(day):
            for hour in sorted(fields.hours):
                for minute in sorted(fields.minutes):
                    wall = datetime(day.year, day.month, day.day, hour, minute)
                    for instant in _instants(wall, zone, model):
                        if start < instant <= end:
                            out.add(instant)
        day += timedelta(days=1)
    return sorted(out)


def _instants(wall: datetime, zone: ZoneInfo, model: DstModel) -> list[datetime]:
    candidates = []
    for fold in (0, 1):
        local = wall.replace(tzinfo=zone, fold=fold)
        instant = local.astimezone(UTC)
        if instant.astimezone(zone).replace(tzinfo=None) == wall:  # exists
            candidates.append(instant)
    unique = sorted(set(candidates))
    if model is DstModel.WALL_ONCE:
        return unique[:1]
    return unique


# Every offset change on record moves wall time by at most two hours.
_AROUND = timedelta(hours=3)


@dataclass(frozen=True)
class DstDifference:
    """Where a target's DST rule makes it fire differently from oncely around one change."""

    missing: tuple[datetime, ...]  # oncely slots the target never fires for
    extra: tuple[datetime, ...]  # target firings that are not oncely slots


def dst_differences(
    schedule: CronSchedule, model: DstModel, now: datetime, years: int = 12
) -> list[DstDifference]:
    """Compare oncely's slots with the target's around every offset change in `years`."""
    zone = schedule.zone
    if str(zone) == "UTC":
        return []
    fields = cron_fields(schedule.expr)
    found = []
    seen: set[tuple[object, ...]] = set()
    for change in _transitions(zone, now, years):
        lo, hi = change - _AROUND, change + _AROUND
        # Slots near a change depend only on the offsets, the local time of the change and
        # which nearby dates match; changes alike in those give the same answer.
        local = change.astimezone(zone)
        days = tuple(fields.matches_day(local.date() + timedelta(days=k)) for k in (-1, 0, 1))
        alike = (lo.astimezone(zone).utcoffset(), local.utcoffset(), local.time(), days)
        if alike in seen:
            continue
        seen.add(alike)
        # Compare in UTC: two aware times in one zone compare by wall time, fold ignored.
        ours_utc = {s.astimezone(UTC) for s in schedule.slots_between(lo, hi)}
        theirs = set(model_slots(fields, zone, model, lo, hi))
        if ours_utc != theirs:
            found.append(
                DstDifference(
                    missing=tuple(sorted(ours_utc - theirs)),
                    extra=tuple(sorted(theirs - ours_utc)),
                )
            )
    return found


def dst_warning(
    job: Job, schedule: CronSchedule, target: str, model: DstModel, now: datetime
) -> str | None:
    """One line naming the job and how the target's DST handling differs, or None."""
    diffs = dst_differences(schedule, model, now)
    if not diffs:
        return None
    zone = schedule.zone
    missing = [t for d in diffs for t in d.missing]
    extra = [t for d in diffs for t in d.extra]
    parts = []
    if missing:
        first = missing[0].astimezone(zone).isoformat(timespec="minutes")
        parts.append(
            f"skips slots at DST changes that oncely runs (first: {first}); "
            "run `oncely worker` as well, or add a schedule for those times"
        )
    if extra:
        first = extra[0].astimezone(zone).isoformat(timespec="minutes")
        parts.append(
            f"fires extra times in repeated hours (first: {first}); "
            "`oncely run` maps each to a slot already claimed, so it has no second effect"
        )
    return f"job {job.name!r}: {target} in {zone} " + "; ".join(parts)


def partition(
    jobs: Sequence[Job], build: Callable[[Sequence[Job]], object]
) -> tuple[list[Job], list[UnsupportedScheduleError]]:
    """The jobs a target can express (each built alone by `build`) and the refusals of the rest."""
    kept: list[Job] = []
    refused: list[UnsupportedScheduleError] = []
    for job in jobs:
        try:
            build([job])
        except UnsupportedScheduleError as exc:
            refused.append(exc)
        else:
            kept.append(job)
    return kept, refused


@dataclass
class Export:
    """The text (or JSON-ready data) a target produced, and the warnings to print on stderr."""

    text: str
    data: Any
    warnings: list[str] = field(default_factory=list)


def resource_name(job: str, prefix: str, allowed: str, limit: int, lower: bool = False) -> str:
    """A name for the job's resource that the target accepts, unique per job name.

    Characters the target forbids become '-'; when that changed anything or the name is too
    long, a short hash of the job name keeps two jobs from mapping to one resource.
    """
    text = job.lower() if lower else job
    clean = re.sub(f"[^{allowed}]+", "-", text).strip("-")
    name = f"{prefix}{clean}"
    if clean != job or len(name) > limit:
        digest = hashlib.sha256(job.encode()).hexdigest()[:8]
        name = f"{name[: limit - 9].rstrip('-')}-{digest}"
    return name


def command(job: str, app_spec: str | None, now: str | None = None) -> list[str]:
    """The `oncely run` command line a target starts for one slot of the job."""
    argv = ["oncely"]
    if app_spec:
        argv += ["--app", app_spec]
    argv += ["run", job]
    if now is not None:
        argv += ["--now", now]
    return argv


class _YamlMissingError(ConfigError):
    """YAML output needs PyYAML: install oncely's `export` extra, or ask for --format json."""


def to_yaml(value: object) -> str:
    """Plain data as block YAML: PyYAML's safe dumper, keys in their given order, lists
    indented under their key. A string that YAML would read back as something else (`OFF`,
    `2010-09-09`, `3`) is quoted by the dumper's own resolver."""
    try:
        import yaml  # the `export` extra: only YAML output needs it
    except ImportError as exc:
        raise _YamlMissingError() from exc

    class _Dumper(yaml.SafeDumper):  # type: ignore[misc]  # PyYAML is untyped (Any)
        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            super().increase_indent(flow, False)  # `- item` two spaces under its key

    text: str = yaml.dump(
        value,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1_000_000,  # never fold a long value (a JSON `Input`) over lines
    )
    return text.rstrip("\n")


def standard_cron(job: Job, fields: CronFields, target: str) -> str:
    """The fields in plain 5-field cron (Vixie cron, cronie, Kubernetes' robfig/cron).

    Those crons OR a restricted day-of-month with a restricted day-of-week and AND them when
    either field is `*`; neither knows `L`, `LW` or `#`.
    """
    if fields.dom_special:
        construct = "`L` (last day of the month)" if fields.last_day else "`LW` (last weekday)"
        raise UnsupportedScheduleError(job.name, target, construct)
    if fields.dow_special:
        construct = "`#` (nth weekday of the month)" if fields.nth_weekdays else "`L` weekdays"
        raise UnsupportedScheduleError(
            job.name, target, f"{construct} in the day-of-week field", "use EventBridge or systemd"
        )
    if fields.rule is DayRule.AND:
        raise UnsupportedScheduleError(
            job.name,
            target,
            f"{fields.rule.value} both restricted (it would OR them)",
            "make one of the two fields `*`",
        )
    minute = _std_field(fields.minutes, 0, 59)
    hour = _std_field(fields.hours, 0, 23)
    month = _std_field(fields.months, 1, 12)
    # A restricted day field never starts with `*`: that would turn cron's OR into AND.
    dom = "*" if fields.rule in (DayRule.ALL, DayRule.DOW) else _std_field(fields.days, 1, 31, "")
    dow = "*" if fields.rule in (DayRule.ALL, DayRule.DOM) else compact(fields.weekdays)
    return f"{minute} {hour} {dom} {month} {dow}"


def _std_field(values: frozenset[int], lo: int, hi: int, star: str = "*") -> str:
    if values == frozenset(range(lo, hi + 1)):
        return "*"
    steps = progression(values, hi)
    if steps is None:
        return compact(values)
    start, step = steps
    return f"{star}/{step}" if start == lo and star else f"{start}-{hi}/{step}"
