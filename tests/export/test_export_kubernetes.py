"""Kubernetes and crontab export: plain 5-field cron, refusals, DST warnings, validation."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from export_helpers import HERE, oncely
from export_std_cron import fires
from export_strategies import cron_expressions
from hypothesis import HealthCheck, assume, given, settings

from oncely import cron
from oncely.errors import ConfigError
from oncely.export.base import (
    DayRule,
    DstModel,
    UnsupportedScheduleError,
    cron_fields,
    dst_warning,
    standard_cron,
)
from oncely.registry import Job, Registry

UTC = timezone.utc


def _job(expr: str, tz: str = "UTC") -> Job:
    return Registry().add_job(cron(expr, tz), lambda db, now: None, name="j")


@pytest.mark.parametrize(
    ("expr", "out"),
    [
        ("0 18 * * FRI", "0 18 * * 5"),
        ("0 9 * * SUN,7", "0 9 * * 0"),
        ("*/15 9-17 * JAN-MAR,OCT *", "*/15 9-17 * 1-3,10 *"),
        ("0 12 5 * MON", "0 12 5 * 1"),  # both restricted: OR, in cronsim and in cron
        ("0 0 1-31 * MON", "0 0 * * *"),  # a full day-of-month ORed: every day
        ("0 0 */2 * 0-6", "0 0 1-31/2 * *"),
        ("5,25,45 1,3,5 * * *", "5-59/20 1,3,5 * * *"),
        ("0 0 1-31/2 * MON", "0 0 1-31/2 * 1"),
    ],
)
def test_standard_cron_translates_exactly(expr: str, out: str) -> None:
    assert standard_cron(_job(expr), cron_fields(expr), "Kubernetes CronJob") == out


@pytest.mark.parametrize(
    ("expr", "construct"),
    [
        ("0 23 L * *", "`L` (last day of the month)"),
        ("0 23 LW * *", "`LW` (last weekday)"),
        ("30 7 * * TUE#2", "`#` (nth weekday of the month)"),
        ("0 20 * * 5L", "`L` weekdays"),
        ("0 12 */2 * MON", "day-of-month AND day-of-week both restricted"),
    ],
)
def test_standard_cron_refuses_naming_job_target_construct(expr: str, construct: str) -> None:
    with pytest.raises(UnsupportedScheduleError) as err:
        standard_cron(_job(expr), cron_fields(expr), "Kubernetes CronJob")
    assert str(err.value).startswith("job 'j': Kubernetes CronJob cannot express ")
    assert construct in str(err.value)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=cron_expressions)
def test_standard_cron_fires_at_oncelys_slots(expr: str) -> None:
    schedule = cron(expr, "UTC")
    try:
        schedule.check()
    except ConfigError:
        assume(False)
    fields = cron_fields(expr)
    try:
        text = standard_cron(_job(expr), fields, "Kubernetes CronJob")
    except UnsupportedScheduleError:
        assert fields.dom_special or fields.dow_special or fields.rule is DayRule.AND
        return
    begin = datetime(2027, 1, 30, tzinfo=UTC)
    ours = []
    for slot in schedule.slots_after(begin):
        if len(ours) == 200 or slot > begin + timedelta(days=62):
            break
        ours.append(slot)
    end = ours[-1] if len(ours) == 200 else begin + timedelta(days=62)
    assert fires(text, begin, end) == ours


def test_dst_warnings_name_the_job_and_the_difference() -> None:
    now = datetime(2027, 1, 1, tzinfo=UTC)
    gap = _job("30 2 * * *", "America/New_York")
    fold = _job("30 1 * * *", "America/New_York")
    hourly = _job("0 * * * *", "America/New_York")
    k8s = "Kubernetes CronJob"
    gap_warning = dst_warning(gap, gap.schedule, k8s, DstModel.ELAPSED, now)  # type: ignore[arg-type]
    assert gap_warning is not None and gap_warning.startswith("job 'j': Kubernetes CronJob")
    assert "skips" in gap_warning and "2027-03-14T03:00-04:00" in gap_warning
    fold_warning = dst_warning(fold, fold.schedule, k8s, DstModel.ELAPSED, now)  # type: ignore[arg-type]
    assert fold_warning is not None and "extra" in fold_warning
    assert "2027-11-07T01:30-05:00" in fold_warning and "no second effect" in fold_warning
    # Elapsed-time expressions fire at every real hour in oncely and in a CronJob alike.
    assert dst_warning(hourly, hourly.schedule, k8s, DstModel.ELAPSED, now) is None  # type: ignore[arg-type]
    # A zone without DST never warns.
    utc = _job("30 2 * * *", "UTC")
    assert dst_warning(utc, utc.schedule, k8s, DstModel.ELAPSED, now) is None  # type: ignore[arg-type]


EXPORTABLE = [
    "leaderboard_close",
    "weekday_mornings",
    "quarter_hours",
    "first_and_fifteenth",
    "every_five_minutes",
    "every_two_hours",
    "fifth_or_monday",
    "nightly_230",
]


def _jobs_args(names: list[str]) -> list[str]:
    return [arg for name in names for arg in ("--job", name)]


def test_kubernetes_output_passes_kubernetes_validate(tmp_path: Path) -> None:
    if shutil.which("kubernetes-validate") is None:
        pytest.fail("kubernetes-validate is missing: pip install -e '.[test]'")
    result = oncely(
        "export", "kubernetes", "--image", "registry.example.com/app:1.2.3",
        "--namespace", "jobs", "--env-from-secret", "oncely-db", *_jobs_args(EXPORTABLE),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifests = tmp_path / "cronjobs.yaml"
    manifests.write_text(result.stdout)
    check = subprocess.run(
        ["kubernetes-validate", "--strict", "--quiet", str(manifests)],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert result.stdout.count("kind: CronJob") == len(EXPORTABLE)
    assert "schedule: 0 18 * * 5" in result.stdout
    assert "timeZone: America/Mexico_City" in result.stdout
    assert "concurrencyPolicy: Forbid" in result.stdout
    assert "schedule: '*/5 * * * *'" in result.stdout and "timeZone: UTC" in result.stdout
    assert "warning: job 'nightly_230': Kubernetes CronJob in America/New_York" in result.stderr
    # The validator does reject a manifest with an unknown field (the check can fail).
    manifests.write_text(result.stdout.replace("concurrencyPolicy:", "concurrencyPolicyy:"))
    check = subprocess.run(
        ["kubernetes-validate", "--strict", "--quiet", str(manifests)],
        capture_output=True,
        text=True,
    )
    assert check.returncode != 0


def test_kubernetes_json_is_one_list_document_and_refusals_exit_2() -> None:
    result = oncely(
        "export", "kubernetes", "--format", "json", "--image", "app:1", "--job", "leaderboard_close"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kind"] == "List"
    (item,) = data["items"]
    spec = item["spec"]
    assert spec["schedule"] == "0 18 * * 5" and spec["startingDeadlineSeconds"] == 300
    assert spec["jobTemplate"]["spec"]["backoffLimit"] == 2
    container = spec["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["oncely", "--app", "exportapp", "run", "leaderboard_close"]
    refused = oncely("export", "kubernetes", "--image", "app:1", "--job", "month_end")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "job 'month_end': Kubernetes CronJob cannot express `L`" in refused.stderr
    every_job = oncely("export", "kubernetes", "--image", "app:1", "--strict")  # some refused
    assert every_job.returncode == 2 and every_job.stdout == ""
    unknown = oncely("export", "kubernetes", "--image", "app:1", "--job", "nope")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert "unknown job 'nope'" in unknown.stderr


def test_crontab_groups_jobs_under_cron_tz() -> None:
    result = oncely("export", "crontab", "--oncely", "/srv/app/bin/oncely", *_jobs_args(EXPORTABLE))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    at = lines.index("CRON_TZ=America/Mexico_City")
    assert lines[at + 2] == (
        f"0 18 * * 5 cd {HERE} && /srv/app/bin/oncely --app exportapp run leaderboard_close"
    )
    assert "CRON_TZ=UTC" in lines and "CRON_TZ=Asia/Kolkata" in lines
    assert "0 */2 * * * cd " in result.stdout
    assert "/srv/app/bin/oncely --app exportapp run every_two_hours\n" in result.stdout
    assert "warning: job 'nightly_230': crontab in America/New_York" in result.stderr
    data = json.loads(
        oncely(
            "export", "crontab", "--format", "json", "--job", "quarter_hours",
            "--oncely", "oncely", "--working-directory", "/srv/app",
        ).stdout
    )  # fmt: skip
    assert data["entries"] == [
        {
            "job": "quarter_hours",
            "cron_tz": "UTC",
            "line": "*/15 9-17 * 1-3,10 * cd /srv/app && oncely --app exportapp run quarter_hours",
        }
    ]
    refused = oncely("export", "crontab", "--job", "every_seven_minutes")
    assert refused.returncode == 2 and "crontab cannot express every(seconds=420)" in refused.stderr
