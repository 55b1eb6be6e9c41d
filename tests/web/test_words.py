"""Pure pieces of the overview: schedules in words, and the DST gaps and folds ahead."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from oncely import cron, every
from oncely.web.words import dst_shifts, in_words


@pytest.mark.parametrize(
    "schedule,words",
    [
        (every(seconds=1), "every second"),
        (every(minutes=15), "every 15 minutes"),
        (every(hours=1), "every hour"),
        (every(days=2), "every 2 days"),
        (cron("0 18 * * FRI", tz="America/Mexico_City"), "at 18:00 on Friday"),
        (cron("30 2 * * *"), "every day at 02:30"),
        (cron("5 * * * *"), "every hour at minute 5"),
        (cron("*/10 * * * *"), "every 10 minutes"),
        (cron("0 9 1 * *"), "at 09:00 on day 1 of every month"),
        (cron("0 9-17/2 * * MON-FRI"), "cron 0 9-17/2 * * MON-FRI"),
    ],
)
def test_schedules_in_words(schedule: object, words: str) -> None:
    assert in_words(schedule) == words  # type: ignore[arg-type]


def test_a_spring_gap_and_an_autumn_fold_are_found_with_their_slots() -> None:
    job = cron("30 2 * * *", tz="America/New_York")
    march = datetime(2026, 3, 1, tzinfo=timezone.utc)
    (gap,) = dst_shifts(job, march)
    assert gap.kind == "gap"
    assert gap.at == datetime(2026, 3, 8, 7, 0, tzinfo=timezone.utc)  # 02:00 EST
    assert gap.after - gap.before == timedelta(hours=1)
    # 02:30 does not exist on 8 March: that day's slot runs at the jump (03:00 EDT), as
    # Debian's cron does, and the page lists it.
    assert [s.astimezone(timezone.utc) for s in gap.slots] == [
        datetime(2026, 3, 8, 7, 0, tzinfo=timezone.utc)
    ]
    (fold,) = dst_shifts(
        cron("30 1 * * *", tz="America/New_York"), datetime(2026, 10, 20, tzinfo=timezone.utc)
    )
    assert fold.kind == "fold" and fold.at == datetime(2026, 11, 1, 6, 0, tzinfo=timezone.utc)
    assert len(fold.slots) >= 1


def test_utc_jobs_have_no_shifts() -> None:
    assert dst_shifts(every(hours=1), datetime(2026, 3, 1, tzinfo=timezone.utc)) == []
    assert dst_shifts(cron("0 * * * *"), datetime(2026, 3, 1, tzinfo=timezone.utc)) == []
