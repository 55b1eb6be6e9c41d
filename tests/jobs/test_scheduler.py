"""The scheduler's decisions, pure: an injected clock, no database, no sleeps."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from oncely import ConfigError, cron, every
from oncely.model import RunStatus
from oncely.registry import Job, Registry
from oncely.scheduler import (
    MAX_CATCH_UP,
    NONE_WINDOW,
    Action,
    Missed,
    OverlapSkipped,
    Run,
    Scheduler,
)

UTC = timezone.utc
T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def noop(db: object, now: datetime) -> None:
    return None


def make_job(schedule: object = None, **options: object) -> Job:
    registry = Registry()
    return registry.add_job(schedule or every(seconds=1), noop, name="j", **options)  # type: ignore[arg-type]


def simulate(
    job: Job,
    start: datetime,
    end: datetime,
    outcome: Callable[[datetime], RunStatus] = lambda _s: RunStatus.RAN,
) -> tuple[list[datetime], int]:
    """Drive a scheduler with a clock that jumps to each wake-up; the slots run and the wakes."""
    sched = Scheduler([job], start, rng=random.Random(1))
    sched.sync(job.name, None)
    ran: list[datetime] = []
    wakes = 0
    while True:
        wake = sched.next_wake()
        assert wake is not None
        if wake > end:
            return ran, wakes
        wakes += 1
        assert sched.unsynced(wake) == []  # a punctual worker never has two slots due
        for action in sched.due(wake):
            assert isinstance(action, Run), action
            for slot in action.slots:
                status = outcome(slot)
                if status is RunStatus.RAN:
                    ran.append(slot)
                sched.finished(job, slot, status, wake)


def test_a_month_of_friday_18h_mexico_city() -> None:
    job = make_job(cron("0 18 * * FRI", tz="America/Mexico_City"))
    start = datetime(2026, 11, 1, tzinfo=ZoneInfo("America/Mexico_City"))
    ran, wakes = simulate(job, start, datetime(2026, 12, 1, tzinfo=ZoneInfo("America/Mexico_City")))
    assert [s.isoformat() for s in ran] == [
        "2026-11-06T18:00:00-06:00",
        "2026-11-13T18:00:00-06:00",
        "2026-11-20T18:00:00-06:00",
        "2026-11-27T18:00:00-06:00",
    ]
    assert wakes == 4  # it slept from slot to slot: no polling


def _expected_0230_new_york(first: datetime, last: datetime) -> list[datetime]:
    """02:30 local every day; on the spring-forward day 02:30 does not exist: 03:00 (as cron)."""
    ny = ZoneInfo("America/New_York")
    out = []
    day = first
    while day <= last:
        wall = datetime(day.year, day.month, day.day, 2, 30, tzinfo=ny)
        if wall.astimezone(UTC).astimezone(ny).replace(tzinfo=None) != wall.replace(tzinfo=None):
            wall = datetime(day.year, day.month, day.day, 3, 0, tzinfo=ny)  # in the gap
        out.append(wall)
        day += timedelta(days=1)
    return out


@pytest.mark.parametrize(
    ("first", "last"),
    [
        (datetime(2026, 2, 20), datetime(2026, 3, 20)),  # spring forward: Sun 8 March
        (datetime(2026, 10, 18), datetime(2026, 11, 15)),  # fall back: Sun 1 November
    ],
)
def test_0230_every_day_across_new_york_dst(first: datetime, last: datetime) -> None:
    ny = ZoneInfo("America/New_York")
    job = make_job(cron("30 2 * * *", tz="America/New_York"))
    start = first.replace(tzinfo=ny)
    end = last.replace(hour=23, tzinfo=ny)
    ran, wakes = simulate(job, start, end)
    expected = _expected_0230_new_york(first, last)
    assert [s.astimezone(UTC) for s in ran] == [s.astimezone(UTC) for s in expected]
    assert len(ran) == len(set(ran)) == wakes == 29
    # The DST days themselves, spelled out.
    days = {s.date().isoformat(): s.isoformat() for s in ran}
    if first.month == 2:
        assert days["2026-03-08"] == "2026-03-08T03:00:00-04:00"
        assert days["2026-03-09"] == "2026-03-09T02:30:00-04:00"
    else:
        assert days["2026-11-01"] == "2026-11-01T02:30:00-05:00"  # once, after the fold
        assert days["2026-10-31"] == "2026-10-31T02:30:00-04:00"


def _start(job: Job, started: datetime, last_claimed: datetime | None) -> Scheduler:
    sched = Scheduler([job], started, rng=random.Random(1))
    assert sched.unsynced(started) == [job.name]  # it always reads the ledger first
    sched.sync(job.name, last_claimed)
    return sched


def _runs(actions: list[Action]) -> list[datetime]:
    return [s for a in actions if isinstance(a, Run) for s in a.slots]


def _missed(actions: list[Action]) -> list[Missed]:
    return [a for a in actions if isinstance(a, Missed)]


def test_a_job_with_no_claims_starts_with_the_first_slot_after_start() -> None:
    job = make_job(every(seconds=10))
    sched = _start(job, T0 + timedelta(seconds=3), None)
    assert sched.due(T0 + timedelta(seconds=9)) == []
    assert sched.next_wake() == T0 + timedelta(seconds=10)
    assert _runs(sched.due(T0 + timedelta(seconds=10))) == [T0 + timedelta(seconds=10)]


def test_catch_up_latest_runs_the_newest_missed_slot_and_reports_the_rest() -> None:
    job = make_job(every(minutes=1))
    sched = _start(job, T0 + timedelta(minutes=10, seconds=5), T0)
    actions = sched.due(T0 + timedelta(minutes=10, seconds=5))
    assert _runs(actions) == [T0 + timedelta(minutes=10)]
    [missed] = _missed(actions)
    assert (missed.count, missed.reason) == (9, "catch_up")
    assert (missed.first, missed.last) == (T0 + timedelta(minutes=1), T0 + timedelta(minutes=9))


def test_catch_up_all_runs_every_missed_slot_oldest_first() -> None:
    job = make_job(every(minutes=1), catch_up="all")
    sched = _start(job, T0 + timedelta(minutes=10, seconds=5), T0)
    actions = sched.due(T0 + timedelta(minutes=10, seconds=5))
    assert _runs(actions) == [T0 + timedelta(minutes=m) for m in range(1, 11)]
    assert _missed(actions) == []


def test_catch_up_all_is_bounded() -> None:
    job = make_job(every(seconds=1), catch_up="all")
    now = T0 + timedelta(seconds=MAX_CATCH_UP + 50)
    actions = _start(job, now, T0).due(now)
    runs = _runs(actions)
    assert len(runs) == MAX_CATCH_UP and runs[-1] == now and runs == sorted(runs)
    [missed] = _missed(actions)
    assert (missed.count, missed.first, missed.last) == (
        50,
        T0 + timedelta(seconds=1),
        runs[0] - timedelta(seconds=1),
    )


def test_catch_up_none_runs_only_a_slot_that_is_on_time() -> None:
    job = make_job(every(hours=1), catch_up="none")
    late = T0 + timedelta(hours=3, minutes=1)
    actions = _start(job, late, T0).due(late)
    assert _runs(actions) == []
    assert [(m.count, m.reason) for m in _missed(actions)] == [(3, "grace")]
    # Within NONE_WINDOW the newest slot is on time.
    prompt = T0 + timedelta(hours=3) + NONE_WINDOW
    actions = _start(job, prompt, T0).due(prompt)
    assert _runs(actions) == [T0 + timedelta(hours=3)]
    assert [(m.count, m.reason) for m in _missed(actions)] == [(2, "catch_up")]


def test_grace_drops_slots_that_are_too_late() -> None:
    job = make_job(every(hours=1), grace=timedelta(minutes=5))
    now = T0 + timedelta(hours=2, minutes=6)
    actions = _start(job, now, T0).due(now)
    assert _runs(actions) == []
    [missed] = _missed(actions)
    assert (missed.count, missed.reason, missed.last) == (2, "grace", T0 + timedelta(hours=2))


def test_a_stall_asks_the_ledger_before_deciding() -> None:
    job = make_job(every(seconds=1))
    sched = _start(job, T0, None)
    assert _runs(sched.due(T0 + timedelta(seconds=1))) == [T0 + timedelta(seconds=1)]
    sched.finished(job, T0 + timedelta(seconds=1), RunStatus.RAN, T0 + timedelta(seconds=1))
    # Suspended for 10 s: several slots due at once. Others ran up to :09 meanwhile.
    late = T0 + timedelta(seconds=11, milliseconds=5)
    assert sched.unsynced(late) == ["j"]
    sched.sync("j", T0 + timedelta(seconds=9))
    actions = sched.due(late)
    assert _runs(actions) == [T0 + timedelta(seconds=11)]
    assert [(m.count, m.first) for m in _missed(actions)] == [(1, T0 + timedelta(seconds=10))]


def test_a_busy_slot_is_retried_until_claimed() -> None:
    job = make_job(every(minutes=1))
    sched = _start(job, T0, None)
    slot = T0 + timedelta(minutes=1)
    assert _runs(sched.due(slot)) == [slot]
    sched.finished(job, slot, RunStatus.BUSY, slot)
    retry_at = sched.next_wake()
    assert retry_at is not None and slot < retry_at <= slot + timedelta(milliseconds=75)
    assert sched.due(slot) == []  # not before its time
    for _ in range(11):  # the holder keeps it: the delay grows, capped at ~1 s
        now = sched.next_wake()
        assert now is not None
        [action] = sched.due(now)
        assert action == Run(job, (slot,), retry=True)
        sched.finished(job, slot, RunStatus.BUSY, now)
    delay = sched.next_wake() - now  # type: ignore[operator]
    assert timedelta(seconds=0.5) <= delay <= timedelta(seconds=1.5)  # grown, then capped
    now = sched.next_wake()
    assert now is not None
    sched.due(now)
    sched.finished(job, slot, RunStatus.SKIPPED, now)  # the holder committed
    assert sched.next_wake() == T0 + timedelta(minutes=2)


def test_a_busy_slot_past_grace_is_reported_missed() -> None:
    job = make_job(every(minutes=1), grace=timedelta(seconds=30))
    sched = _start(job, T0, None)
    slot = T0 + timedelta(minutes=1)
    sched.due(slot)
    sched.finished(job, slot, RunStatus.BUSY, slot + timedelta(seconds=31))
    actions = sched.due(slot + timedelta(seconds=32))
    assert actions == [Missed(job, 1, slot, slot, "busy")]


def test_overlap_skip_does_not_start_a_slot_while_the_previous_runs() -> None:
    job = make_job(every(seconds=1))
    sched = _start(job, T0, None)
    one, two, three = (T0 + timedelta(seconds=n) for n in (1, 2, 3))
    assert _runs(sched.due(one)) == [one]  # still running at :02
    assert sched.due(two) == [OverlapSkipped(job, two, one)]
    sched.finished(job, one, RunStatus.RAN, two + timedelta(milliseconds=500))
    assert _runs(sched.due(three)) == [three]


def test_overlap_allow_starts_it_anyway() -> None:
    job = make_job(every(seconds=1), overlap="allow")
    sched = _start(job, T0, None)
    one, two = T0 + timedelta(seconds=1), T0 + timedelta(seconds=2)
    assert _runs(sched.due(one)) == [one]
    assert _runs(sched.due(two)) == [two]


def test_a_clock_behind_the_ledger_runs_nothing_old() -> None:
    """A replica whose clock is 90 s behind: the ledger is ahead of it; it does not rerun."""
    job = make_job(every(seconds=1))
    behind = T0 - timedelta(seconds=90)
    sched = _start(job, behind, T0)
    assert sched.due(behind + timedelta(seconds=60)) == []
    assert sched.next_wake() == T0 + timedelta(seconds=1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"catch_up": "some"}, "catch_up must be one of latest, all, none"),
        ({"overlap": "queue"}, "overlap must be one of skip, allow"),
        ({"grace": 5}, "grace must be a positive timedelta"),
        ({"grace": timedelta(0)}, "grace must be a positive timedelta"),
    ],
)
def test_bad_policies_fail_at_registration(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        make_job(every(seconds=1), **options)
    assert "job 'j'" in str(info.value)
