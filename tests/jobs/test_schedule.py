"""Schedules are pure: the same slots for every replica, DST handled like Debian cron."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncely import ConfigError, cron, every
from oncely.errors import BadInputError
from oncely.schedule import default_key

UTC = timezone.utc
NY = ZoneInfo("America/New_York")
MX = ZoneInfo("America/Mexico_City")


def slots_on(schedule, day_start: datetime, days: int = 1) -> list[datetime]:  # type: ignore[no-untyped-def]
    return list(
        schedule.slots_between(
            day_start - timedelta(seconds=1),
            day_start + timedelta(days=days) - timedelta(seconds=1),
        )
    )


@pytest.mark.parametrize(
    ("expr", "day", "expected_local"),
    [
        # Spring forward (2026-03-08): 02:30 does not exist; it fires once, right after the jump.
        ("30 2 * * *", datetime(2026, 3, 8, tzinfo=NY), ["2026-03-08T03:00:00-04:00"]),
        ("30 1 * * *", datetime(2026, 3, 8, tzinfo=NY), ["2026-03-08T01:30:00-05:00"]),
        # Fall back (2026-11-01): 01:30 happens twice; it fires once, at the first.
        ("30 1 * * *", datetime(2026, 11, 1, tzinfo=NY), ["2026-11-01T01:30:00-04:00"]),
        ("30 2 * * *", datetime(2026, 11, 1, tzinfo=NY), ["2026-11-01T02:30:00-05:00"]),
    ],
)
def test_dst_days_give_one_slot_per_day(
    expr: str, day: datetime, expected_local: list[str]
) -> None:
    got = slots_on(cron(expr, tz="America/New_York"), day)
    assert [s.isoformat() for s in got] == expected_local


def test_wildcard_schedules_run_on_elapsed_time_across_the_fold() -> None:
    day = datetime(2026, 11, 1, tzinfo=NY)
    got = slots_on(cron("0 * * * *", tz="America/New_York"), day)
    # 25 real hours that day: the repeated 01:00 fires twice, once per real hour.
    assert len(got) == 25
    utc = [s.astimezone(UTC) for s in got]
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(utc))


def test_a_month_of_friday_closes_in_mexico_city() -> None:
    schedule = cron("0 18 * * FRI", tz="America/Mexico_City")
    got = list(
        schedule.slots_between(datetime(2026, 11, 1, tzinfo=MX), datetime(2026, 12, 1, tzinfo=MX))
    )
    assert [s.isoformat() for s in got] == [
        f"2026-11-{d:02d}T18:00:00-06:00" for d in (6, 13, 20, 27)
    ]
    assert [default_key(s) for s in got][-1] == "2026-11-28T00:00:00Z"


def test_latest_at_or_before_maps_every_minute_of_the_window_to_the_same_slot() -> None:
    schedule = cron("0 18 * * FRI", tz="America/Mexico_City")
    slot = datetime(2026, 11, 27, 18, tzinfo=MX)
    for minute in range(0, 60 * 24 * 7, 37):
        now = slot + timedelta(minutes=minute)
        assert schedule.latest_at_or_before(now) == slot
    assert schedule.latest_at_or_before(slot - timedelta(seconds=1)) == slot - timedelta(days=7)


def test_latest_at_or_before_sees_the_gap_slot_moved_past_the_jump() -> None:
    schedule = cron("30 2 * * *", tz="America/New_York")
    at = datetime(2026, 3, 8, 3, 5, tzinfo=NY)
    assert schedule.latest_at_or_before(at) == datetime(2026, 3, 8, 3, 0, tzinfo=NY)


def test_cron_features_names_ranges_steps_last_and_nth() -> None:
    assert cron("0 9 L * *").next_after(datetime(2026, 2, 1, tzinfo=UTC)) == datetime(
        2026, 2, 28, 9, tzinfo=UTC
    )
    # The second Monday of December 2026.
    assert cron("0 9 * * MON#2").next_after(datetime(2026, 12, 1, tzinfo=UTC)) == datetime(
        2026, 12, 14, 9, tzinfo=UTC
    )
    slots = cron("*/20 8-9 * JAN-FEB MON-FRI").slots_after(datetime(2027, 1, 1, tzinfo=UTC))
    got = [s for _, s in zip(range(7), slots, strict=False)]
    assert [s.strftime("%m-%d %H:%M") for s in got] == [
        "01-01 08:00",
        "01-01 08:20",
        "01-01 08:40",
        "01-01 09:00",
        "01-01 09:20",
        "01-01 09:40",
        "01-04 08:00",
    ]


def test_every_is_aligned_to_the_unix_epoch() -> None:
    schedule = every(minutes=15)
    now = datetime(2026, 11, 29, 10, 7, 31, tzinfo=UTC)
    assert schedule.latest_at_or_before(now) == datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    assert schedule.next_after(now) == datetime(2026, 11, 29, 10, 15, tzinfo=UTC)
    # The same answer from a replica whose clock reads the same instant in another zone.
    assert schedule.next_after(now.astimezone(MX)) == datetime(2026, 11, 29, 10, 15, tzinfo=UTC)
    assert schedule.next_after(datetime(2026, 11, 29, 10, 15, tzinfo=UTC)) == datetime(
        2026, 11, 29, 10, 30, tzinfo=UTC
    )


def test_default_key_is_the_utc_instant() -> None:
    assert default_key(datetime(2026, 11, 27, 18, tzinfo=MX)) == "2026-11-28T00:00:00Z"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: cron("61 * * * *"), "bad cron expression"),
        (lambda: cron("* * * *"), "must have 5 fields"),
        (lambda: cron("0 0 30 2 *"), "cron"),
        (lambda: cron("0 18 * * FRI", tz="Mars/Olympus"), "unknown time zone 'Mars/Olympus'"),
        (lambda: every(seconds=0), "at least 1"),
        (lambda: every(seconds=1.5), "whole number of seconds"),
    ],
)
def test_bad_schedules_raise_config_error_when_used(make, message: str) -> None:  # type: ignore[no-untyped-def]
    schedule = make()
    with pytest.raises(ConfigError, match=message):
        schedule.check()
    with pytest.raises(ConfigError):
        schedule.next_after(datetime(2026, 1, 1, tzinfo=UTC))


def test_naive_times_are_refused() -> None:
    with pytest.raises(BadInputError, match="no UTC offset"):
        cron("* * * * *").next_after(datetime(2026, 1, 1))


ZONES = st.sampled_from(
    [
        "UTC",
        "America/New_York",
        "America/Mexico_City",
        "Europe/London",
        "Australia/Lord_Howe",
        "Asia/Kolkata",
        "America/Santiago",
    ]
)
EXPRS = st.sampled_from(
    [
        "30 2 * * *",
        "30 1 * * *",
        "0 18 * * FRI",
        "*/15 * * * *",
        "0 0 1 * *",
        "5 4 * * SUN",
        "0 */3 * * *",
        "45 23 L * *",
    ]
)
INSTANTS = st.datetimes(
    min_value=datetime(2024, 1, 1), max_value=datetime(2028, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=150, deadline=None)
@given(expr=EXPRS, tz=ZONES, t=INSTANTS)
def test_next_and_latest_agree(expr: str, tz: str, t: datetime) -> None:
    """latest_at_or_before(t) is a slot, nothing lies between it and t, and next_after follows."""
    schedule = cron(expr, tz=tz)
    latest = schedule.latest_at_or_before(t)
    assert latest is not None and latest <= t
    following = schedule.next_after(latest)
    assert following is not None and following > t
    assert schedule.latest_at_or_before(latest) == latest
    assert following.tzinfo is not None and latest.tzinfo is not None


@settings(max_examples=100, deadline=None)
@given(expr=EXPRS, tz=ZONES, t=INSTANTS)
def test_slots_strictly_increase(expr: str, tz: str, t: datetime) -> None:
    schedule = cron(expr, tz=tz)
    got = [s.astimezone(UTC) for _, s in zip(range(60), schedule.slots_after(t), strict=False)]
    assert all(a < b for a, b in itertools.pairwise(got))
    assert got[0] > t


def _transitions(zone: str) -> list[datetime]:
    """Instants (UTC, to the hour) around which `zone`'s UTC offset changes, 2026-2027."""
    tz = ZoneInfo(zone)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    out = []
    previous = start.astimezone(tz).utcoffset()
    for hour in range(1, 2 * 365 * 24):
        t = start + timedelta(hours=hour)
        offset = t.astimezone(tz).utcoffset()
        if offset != previous:
            out.append(t)
        previous = offset
    return out


DST_ZONES = ["Australia/Lord_Howe", "America/New_York", "Europe/London", "America/Santiago"]
TRANSITIONS = [(zone, t) for zone in DST_ZONES for t in _transitions(zone)]
ELAPSED_EXPRS = [
    "*/3 0 * * *",
    "*/15 * * * *",
    "0 * * * *",
    "30 */2 * * *",
    "*/7 1-3 * * *",
    "* 2 * * *",
    "*/20 23,0,1 * * *",
]


def _matches(expr: str, wall: datetime) -> bool:
    from cronsim import CronSim

    return next(CronSim(expr, wall - timedelta(minutes=1))) == wall


@settings(max_examples=40, deadline=None)
@given(
    expr=st.sampled_from(ELAPSED_EXPRS),
    at=st.sampled_from(TRANSITIONS),
    shift=st.integers(min_value=-30, max_value=6),
)
def test_wildcard_slots_are_every_real_minute_whose_wall_time_matches(
    expr: str, at: tuple[str, datetime], shift: int
) -> None:
    """Elapsed-time schedules across DST changes, against a minute-by-minute oracle."""
    zone, transition = at
    tz = ZoneInfo(zone)
    start = transition + timedelta(hours=shift)
    end = start + timedelta(hours=26)
    expected = []
    t = start + timedelta(minutes=1)
    while t <= end:
        if _matches(expr, t.astimezone(tz).replace(tzinfo=None)):
            expected.append(t)
        t += timedelta(minutes=1)
    got = [s.astimezone(UTC) for s in cron(expr, tz=zone).slots_between(start, end)]
    assert got == expected
