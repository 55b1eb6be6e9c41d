"""Catch-up after a long gap costs the same as after a short one: the scheduler counts an
`every(...)` job's missed slots without walking them (60 days of every second is 5 million
slots; walking them blocked the worker's event loop for seconds and stopped heartbeats)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from oncely import every
from oncely.registry import Registry
from oncely.schedule import EverySchedule
from oncely.scheduler import MAX_CATCH_UP, Missed, Run, Scheduler

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)
GAP = timedelta(days=60)


def noop(db: object, now: datetime) -> None:
    return None


@pytest.mark.parametrize(("catch_up", "kept"), [("latest", 1), ("all", MAX_CATCH_UP)])
def test_sixty_days_of_every_second_are_counted_not_walked(
    monkeypatch: pytest.MonkeyPatch, catch_up: str, kept: int
) -> None:
    job = Registry().add_job(every(seconds=1), noop, name="tick", catch_up=catch_up)
    calls = {"n": 0}
    next_after = EverySchedule.next_after

    def counted(self: EverySchedule, t: datetime) -> datetime | None:
        calls["n"] += 1
        return next_after(self, t)

    monkeypatch.setattr(EverySchedule, "next_after", counted)
    sched = Scheduler([job], T0, rng=random.Random(1))
    sched.sync("tick", T0)
    calls["n"] = 0
    now = T0 + GAP
    actions = sched.due(now)
    assert calls["n"] < 10, f"{calls['n']} schedule steps for one decision"
    runs = [a for a in actions if isinstance(a, Run)]
    missed = [a for a in actions if isinstance(a, Missed)]
    total = int(GAP.total_seconds())
    assert [len(r.slots) for r in runs] == [kept]
    assert runs[0].slots[-1] == now
    assert runs[0].slots == tuple(now - timedelta(seconds=kept - 1 - i) for i in range(kept))
    assert [(m.count, m.first, m.last) for m in missed] == [
        (total - kept, T0 + timedelta(seconds=1), now - timedelta(seconds=kept))
    ]
