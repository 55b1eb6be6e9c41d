"""systemd export: OnCalendar= checked with `systemd-analyze calendar` against oncely's slots."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from export_helpers import IN_CI, oncely
from export_strategies import cron_expressions, zones
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from oncely import cron, every
from oncely.errors import ConfigError
from oncely.export import systemd
from oncely.export.base import (
    DstModel,
    UnsupportedScheduleError,
    cron_fields,
    dst_warning,
    model_slots,
)
from oncely.registry import Job, Registry
from oncely.schedule import Schedule

UTC = timezone.utc
ITERATIONS = 25
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None and not IN_CI, reason="systemd-analyze is not installed"
)
_ELAPSE = re.compile(r"(?:Next elapse|Iter\. #\d+): \w+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC")


def _job(schedule: Schedule, name: str = "j") -> Job:
    return Registry().add_job(schedule, lambda db, now: None, name=name)


def analyze(values: list[str], base: datetime) -> list[list[datetime]]:
    """Each OnCalendar= value's next ITERATIONS elapses after `base`, per systemd itself."""
    assert ANALYZE is not None, "systemd-analyze is missing (CI installs the systemd package)"
    out = subprocess.run(
        [
            ANALYZE,
            "calendar",
            f"--iterations={ITERATIONS}",
            f"--base-time={base.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC",
            *values,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TZ": "UTC"},
        check=True,
    ).stdout
    blocks = re.split(r"\n\s*\n", out.strip())
    assert len(blocks) == len(values), out
    return [
        [datetime.fromisoformat(t).replace(tzinfo=UTC) for t in _ELAPSE.findall(block)]
        for block in blocks
    ]


def systemd_fires(job: Job, base: datetime) -> tuple[list[datetime], datetime]:
    """The timer's elapses after `base` (the union of its OnCalendar= lines), and up to when
    that list is complete."""
    lists = analyze(systemd.on_calendar(job), base)
    end = min(ts[-1] for ts in lists if ts)
    return sorted({t for ts in lists for t in ts if t <= end}), end


def _walls(instants: list[datetime], schedule: Schedule) -> list[datetime]:
    return sorted(t.astimezone(schedule.zone).replace(tzinfo=None) for t in instants)


def oncely_slots(schedule: Schedule, base: datetime, end: datetime) -> list[datetime]:
    return [s.astimezone(UTC) for s in schedule.slots_between(base, end)]


@pytest.mark.parametrize(
    ("schedule", "values"),
    [
        (cron("0 18 * * FRI", "America/Mexico_City"), ["Fri *-*-* 18:00:00 America/Mexico_City"]),
        (cron("15 8 * * MON-FRI", "Europe/Madrid"), ["Mon..Fri *-*-* 08:15:00 Europe/Madrid"]),
        (
            cron("*/15 9-17 * JAN-MAR,OCT *"),
            ["*-01..03,10-* 09..17:00,15,30,45:00 UTC"],
        ),
        (cron("0 23 L * *"), ["*-*~01 23:00:00 UTC"]),
        (
            cron("0 17 LW * *"),
            [
                "Mon..Fri *-*~01 17:00:00 UTC",
                "Fri *-*~02 17:00:00 UTC",
                "Fri *-*~03 17:00:00 UTC",
            ],
        ),
        (cron("30 7 * * TUE#2"), ["Tue *-*-08..14 07:30:00 UTC"]),
        (cron("0 20 * * 5L"), ["Fri *-*~01..07 20:00:00 UTC"]),
        (cron("0 12 5 * MON"), ["*-*-05 12:00:00 UTC", "Mon *-*-* 12:00:00 UTC"]),
        (cron("0 12 */10 * SAT"), ["Sat *-*-01,11,21,31 12:00:00 UTC"]),
        (cron("0 12 */15 * MON"), ["Mon *-*-01,16,31 12:00:00 UTC"]),
        (cron("5,25,45 1,3,5 1-5 */5 *"), ["*-01,06,11-01..05 01,03,05:05,25,45:00 UTC"]),
        (every(seconds=10), ["*-*-* *:*:00,10,20,30,40,50 UTC"]),
        (every(minutes=20), ["*-*-* *:00,20,40:00 UTC"]),
        (every(hours=6), ["*-*-* 00,06,12,18:00:00 UTC"]),
    ],
)
def test_on_calendar_values(schedule: Schedule, values: list[str]) -> None:
    assert systemd.on_calendar(_job(schedule)) == values


@needs_analyze
@pytest.mark.parametrize(
    "schedule",
    [
        cron("0 23 L * *"),
        cron("0 17 LW * *"),
        cron("30 7 * * TUE#5"),
        cron("0 20 * * 0L", "Asia/Kolkata"),
        cron("0 12 5 * MON"),
        cron("0 12 */10 * SAT"),
        cron("0 12 */2 * MON"),
        cron("5,25,45 1,3,5 */3 * *", "Europe/Madrid"),
        cron("0 0 L */5 *", "America/New_York"),
        cron("0 */5 * * *", "Europe/London"),
        cron("*/7 */5 * * *"),
        cron("0 18 * * FRI", "America/Mexico_City"),
        every(seconds=10),
        every(minutes=20),
        every(hours=6),
    ],
    ids=str,
)
def test_systemd_fires_at_oncelys_slots(schedule: Schedule) -> None:
    base = datetime(2027, 1, 1, 0, 0, 7, tzinfo=UTC)
    fires, end = systemd_fires(_job(schedule), base)
    assert len(fires) >= 5
    assert fires == oncely_slots(schedule, base, end)


# Bases half a day before the 2027 offset changes of the zones the strategies draw.
BASES = [
    datetime(2027, 1, 4, tzinfo=UTC),
    datetime(2027, 3, 13, 18, tzinfo=UTC),
    datetime(2027, 3, 27, 12, tzinfo=UTC),
    datetime(2027, 4, 3, 0, tzinfo=UTC),
    datetime(2027, 9, 4, 12, tzinfo=UTC),
    datetime(2027, 10, 2, 0, tzinfo=UTC),
    datetime(2027, 10, 30, 12, tzinfo=UTC),
    datetime(2027, 11, 6, 18, tzinfo=UTC),
]


@needs_analyze
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(expr="30 2 * * *", tz="America/New_York", base=BASES[1], shift=0)
@example(expr="30 1 * * *", tz="America/New_York", base=BASES[7], shift=0)
@example(expr="0 * * * *", tz="Europe/Madrid", base=BASES[6], shift=6)
@example(expr="*/20 2 L * *", tz="Europe/Madrid", base=BASES[6], shift=0)
@example(expr="0 */5 * * *", tz="Europe/London", base=BASES[2], shift=0)
@given(expr=cron_expressions, tz=zones, base=st.sampled_from(BASES), shift=st.integers(0, 12))
def test_systemd_agrees_with_oncely_or_export_warns(
    expr: str, tz: str, base: datetime, shift: int
) -> None:
    schedule = cron(expr, tz)
    try:
        schedule.check()
    except ConfigError:
        assume(False)
    job = _job(schedule)
    try:
        systemd.on_calendar(job)
    except UnsupportedScheduleError:
        return
    start = base + timedelta(hours=shift, seconds=7)
    fires, end = systemd_fires(job, start)
    assume(fires)
    # systemd's DST rule is the one oncely models for it: a wall time in the gap is skipped and
    # a repeated one fires once. (Which of the two, systemd does not always pick the same way:
    # with `~` days and a minute repetition it may take the second; so compare wall times.)
    model = model_slots(cron_fields(expr), schedule.zone, DstModel.WALL_ONCE, start, end)
    assert _walls(fires, schedule) == _walls(model, schedule)
    # ... so where it differs from oncely's slots, the export says so.
    if fires != oncely_slots(schedule, start, end):
        assert dst_warning(job, schedule, "systemd", DstModel.WALL_ONCE, start)


def test_refusals_name_job_target_construct() -> None:
    with pytest.raises(UnsupportedScheduleError, match=r"job 'j': systemd cannot express every"):
        systemd.on_calendar(_job(every(seconds=45)))
    with pytest.raises(UnsupportedScheduleError, match="oncely worker"):
        systemd.on_calendar(_job(every(minutes=7)))
    with pytest.raises(UnsupportedScheduleError, match="AND day-of-week with `L`, `LW` or `#`"):
        systemd.on_calendar(_job(cron("0 12 */2 * MON#2")))


def test_cli_writes_a_timer_and_service_per_job(tmp_path: Path) -> None:
    out = tmp_path / "units"
    result = oncely(
        "export", "systemd", "--job", "leaderboard_close", "--job", "nightly_230",
        "--oncely", "/srv/app/bin/oncely", "--working-directory", "/srv/app",
        "--output-dir", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "oncely-leaderboard_close.service",
        "oncely-leaderboard_close.timer",
        "oncely-nightly_230.service",
        "oncely-nightly_230.timer",
    ]
    timer = (out / "oncely-leaderboard_close.timer").read_text()
    assert "OnCalendar=Fri *-*-* 18:00:00 America/Mexico_City\n" in timer
    assert "Persistent=true\n" in timer and "Unit=oncely-leaderboard_close.service\n" in timer
    service = (out / "oncely-leaderboard_close.service").read_text()
    assert "Type=oneshot\n" in service and "WorkingDirectory=/srv/app\n" in service
    assert "ExecStart=/srv/app/bin/oncely --app exportapp run leaderboard_close\n" in service
    assert "warning: job 'nightly_230': systemd in America/New_York skips" in result.stderr
    if ANALYZE is not None:
        verify = subprocess.run(
            [ANALYZE, "verify", *(str(p) for p in sorted(out.iterdir()))],
            capture_output=True,
            text=True,
        )
        # `verify` also checks that ExecStart exists; only the unit syntax matters here.
        problems = [
            line
            for line in verify.stderr.splitlines()
            if line.strip() and "/srv/app/bin/oncely" not in line and "oncely-" in line
        ]
        assert not problems, verify.stderr


def test_json_is_one_document_of_files() -> None:
    import json

    result = oncely("export", "systemd", "--format", "json", "--job", "every_five_minutes")
    assert result.returncode == 0, result.stderr
    files = json.loads(result.stdout)["files"]
    assert sorted(files) == ["oncely-every_five_minutes.service", "oncely-every_five_minutes.timer"]
    assert (
        "OnCalendar=*-*-* *:00,05,10,15,20,25,30,35,40,45,50,55:00 UTC\n"
        in files["oncely-every_five_minutes.timer"]
    )
