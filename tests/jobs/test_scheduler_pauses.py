"""The scheduler's pauses, pure: a slot's fate follows from its time and the pause intervals.

A slot inside a closed pause [paused_at, resumed_at) is paused; one before it or after the
resume runs (catch-up covers both sides); one inside a pause still open is held, and decided
when the pause is seen closed, so a resume whose commit lands late loses nothing.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from oncely import every
from oncely.model import Pause, RunStatus
from oncely.registry import Job, Registry
from oncely.scheduler import HOLD_POLL, Action, Missed, Paused, Run, Scheduler

UTC = timezone.utc
T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def noop(db: object, now: datetime) -> None:
    return None


def make_job(**options: object) -> Job:
    registry = Registry()
    return registry.add_job(every(seconds=1), noop, name="j", **options)  # type: ignore[arg-type]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def pause(start: float, end: float | None = None) -> Pause:
    return Pause("j", at(start), "ops", None, None if end is None else at(end))


def started(job: Job) -> Scheduler:
    """A worker that started at T0 with no claims: its first slot is T0 + 1 s."""
    sched = Scheduler([job], T0, rng=random.Random(1))
    sched.sync(job.name, None)
    return sched


def decide(sched: Scheduler, now: datetime, *pauses: Pause) -> list[Action]:
    """One scheduling step as the loop takes it: the pauses read, then the decisions; every
    slot handed to a run is reported as ran."""
    sched.set_pauses({"j": list(pauses)})
    actions = sched.due(now)
    for action in actions:
        if isinstance(action, Run):
            for slot in action.slots:
                sched.finished(action.job, slot, RunStatus.RAN, now)
    return actions


def ran(actions: list[Action]) -> list[datetime]:
    return [s for a in actions if isinstance(a, Run) for s in a.slots]


def paused(actions: list[Action]) -> list[tuple[int, datetime, datetime]]:
    return [(a.count, a.first, a.last) for a in actions if isinstance(a, Paused)]


def test_a_slot_before_the_pause_runs_on_catch_up() -> None:
    # the worker was down 9 s; the job was paused at 10 s; the worker comes back at 12 s
    sched = started(make_job(catch_up="all", grace=timedelta(minutes=5)))
    actions = decide(sched, at(12), pause(10))
    assert ran(actions) == [at(s) for s in range(1, 10)]
    assert paused(actions) == []  # 10 s .. 12 s are held, not decided


def test_a_slot_before_the_pause_is_caught_up_by_latest_too() -> None:
    sched = started(make_job(catch_up="latest"))
    actions = decide(sched, at(12), pause(10))
    assert ran(actions) == [at(9)]
    missed = [a for a in actions if isinstance(a, Missed)]
    assert [(m.count, m.first, m.last, m.reason) for m in missed] == [(8, at(1), at(8), "catch_up")]


def test_an_open_pause_holds_its_slots() -> None:
    sched = started(make_job(catch_up="all"))
    assert ran(decide(sched, at(4), pause(5))) == [at(1), at(2), at(3), at(4)]
    for second in range(5, 30):
        now = at(second)
        assert decide(sched, now, pause(5)) == []  # neither run nor reported paused
        assert sched.next_wake() == now + HOLD_POLL  # it looks at the pauses again soon


def test_a_slot_inside_a_closed_pause_is_paused() -> None:
    sched = started(make_job(catch_up="all"))
    decide(sched, at(4), pause(5))
    actions = decide(sched, at(20), pause(5, 20))
    assert paused(actions) == [(15, at(5), at(19))]


def test_a_slot_after_the_resume_runs() -> None:
    sched = started(make_job(catch_up="all"))
    decide(sched, at(4), pause(5))
    decide(sched, at(10), pause(5))  # held
    actions = decide(sched, at(20), pause(5, 20))
    assert ran(actions) == [at(20)]
    assert ran(decide(sched, at(21), pause(5, 20))) == [at(21)]


def test_a_late_resume_commit_loses_nothing() -> None:
    # resumed_at is 10 s (the resume statement's clock); its commit is seen at 11.5 s
    sched = started(make_job(catch_up="latest", grace=timedelta(minutes=5)))
    decide(sched, at(4), pause(5))
    assert decide(sched, at(10), pause(5)) == []
    assert decide(sched, at(11), pause(5)) == []
    actions = decide(sched, at(11.5), pause(5, 10))
    assert paused(actions) == [(5, at(5), at(9))]
    assert ran(actions) == [at(10), at(11)]  # held slots all run, whatever the policy
    assert not [a for a in actions if isinstance(a, Missed)]


def test_a_held_slot_past_grace_is_missed_when_the_pause_closes() -> None:
    sched = started(make_job(grace=timedelta(seconds=5)))
    decide(sched, at(4), pause(5))
    decide(sched, at(6), pause(5))
    actions = decide(sched, at(30), pause(5, 10))
    assert paused(actions) == [(5, at(5), at(9))]
    assert ran(actions) == [at(25), at(26), at(27), at(28), at(29), at(30)]
    missed = [a for a in actions if isinstance(a, Missed)]
    assert [(m.count, m.reason) for m in missed] == [(15, "grace")]


def test_catch_up_across_a_closed_pause_covers_both_sides() -> None:
    # the worker was down from 0 s to 40 s; the job was paused from 10 s to 20 s meanwhile
    sched = started(make_job(catch_up="all"))
    actions = decide(sched, at(40), pause(10, 20))
    assert paused(actions) == [(10, at(10), at(19))]
    assert ran(actions) == [at(s) for s in [*range(1, 10), *range(20, 41)]]


def test_a_pause_that_ended_before_the_floor_changes_nothing() -> None:
    sched = started(make_job(catch_up="all"))
    actions = decide(sched, at(3), pause(-20, -10))
    assert ran(actions) == [at(1), at(2), at(3)]
    assert paused(actions) == []


def test_sixty_days_paused_are_counted_not_listed() -> None:
    sched = started(make_job(catch_up="latest"))
    day = 86400
    actions = decide(sched, at(60 * day + 5), pause(5, 60 * day))
    assert paused(actions) == [(60 * day - 5, at(5), at(60 * day - 1))]
    assert ran(actions) == [at(60 * day + 5)]


def test_every_slot_outside_the_pauses_runs_once_and_every_slot_inside_is_paused() -> None:
    """Random pauses (some resumes seen late) and random wake-ups: each slot gets one fate,
    and the fate follows from its time and the intervals alone."""
    for seed in range(40):
        rng = random.Random(seed)
        sched = started(make_job(catch_up="all", grace=timedelta(minutes=5)))
        pauses: list[tuple[float, float, float]] = []  # (paused_at, resumed_at, seen at)
        t = 0.0
        while t < 200:
            start = t + rng.uniform(1, 15)
            end = start + rng.uniform(0.1, 12)
            pauses.append((start, end, end + rng.choice([0.0, 0.3, 1.5, 4.0])))
            t = end + rng.uniform(0, 2)
        fates: dict[datetime, str] = {}
        now = 0.0
        while now < 250:
            now += rng.uniform(0.05, 3.0)
            seen = [
                pause(p, r if now >= visible else None)
                for p, r, visible in pauses
                if p <= now + rng.uniform(0, 0.5)  # a pause commits as it is stamped
            ]
            for action in decide(sched, at(now), *seen):
                if isinstance(action, Run):
                    for slot in action.slots:
                        assert slot not in fates, (seed, slot)
                        fates[slot] = "ran"
                elif isinstance(action, Paused):
                    step = timedelta(seconds=1)
                    for i in range(action.count):
                        slot = action.first + i * step
                        assert slot not in fates, (seed, slot)
                        fates[slot] = "paused"
                else:
                    raise AssertionError((seed, action))
        floor = sched.states["j"].floor
        assert floor is not None
        for slot in [at(s) for s in range(1, int(now) + 1) if at(s) <= floor]:
            inside = any(at(p) <= slot < at(r) for p, r, _ in pauses)
            assert fates.get(slot) == ("paused" if inside else "ran"), (seed, slot)
