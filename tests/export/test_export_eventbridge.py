"""EventBridge Scheduler export: exact AWS cron, refusals, DST warnings, cfn-lint."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime, timedelta, timezone

import pytest
from export_aws_cron import AwsCron
from export_helpers import oncely, oncely_process
from export_strategies import cron_expressions, zones
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from oncely import cron, every
from oncely.errors import ConfigError
from oncely.export import eventbridge
from oncely.export.base import (
    DayRule,
    DstModel,
    UnsupportedScheduleError,
    cron_fields,
    dst_warning,
    model_slots,
)
from oncely.registry import Registry

UTC = timezone.utc
ARGS = [
    "--cluster=arn:aws:ecs:us-east-1:123456789012:cluster/jobs",
    "--task-definition=arn:aws:ecs:us-east-1:123456789012:task-definition/app:7",
    "--container=app",
    "--role-arn=arn:aws:iam::123456789012:role/oncely-scheduler",
    "--subnets=subnet-0123456789abcdef0,subnet-0fedcba9876543210",
    "--security-groups=sg-0123456789abcdef0",
]
# Window starts: a quiet week, and half a day before each 2027 offset change of the zones
# the strategies draw (US, EU, Lord Howe, Santiago), so dense expressions reach them too.
STARTS = [
    datetime(2027, 1, 4, tzinfo=UTC),
    datetime(2027, 3, 13, 18, tzinfo=UTC),
    datetime(2027, 3, 27, 12, tzinfo=UTC),
    datetime(2027, 4, 3, 0, tzinfo=UTC),
    datetime(2027, 9, 4, 12, tzinfo=UTC),
    datetime(2027, 10, 2, 0, tzinfo=UTC),
    datetime(2027, 10, 30, 12, tzinfo=UTC),
    datetime(2027, 11, 6, 18, tzinfo=UTC),
]


def _job(expr: str, tz: str = "UTC", name: str = "j") -> object:
    registry = Registry()
    return registry.add_job(cron(expr, tz), lambda db, now: None, name=name)


def _aws(expr: str, tz: str = "UTC") -> str:
    job = _job(expr, tz)
    return eventbridge.aws_cron(job, cron_fields(expr))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("expr", "aws"),
    [
        ("0 18 * * FRI", "cron(0 18 ? * 6 *)"),
        ("15 8 * * MON-FRI", "cron(15 8 ? * 2-6 *)"),
        ("0 9 * * SAT,SUN", "cron(0 9 ? * 1,7 *)"),
        ("0 9 * * 7", "cron(0 9 ? * 1 *)"),
        ("*/15 9-17 * JAN-MAR,OCT *", "cron(0/15 9-17 * 1-3,10 ? *)"),
        ("0 0 */10 * *", "cron(0 0 1/10 * ? *)"),
        ("0 23 L * *", "cron(0 23 L * ? *)"),
        ("0 17 LW * *", "cron(0 17 LW * ? *)"),
        ("30 7 * * TUE#2", "cron(30 7 ? * 3#2 *)"),
        ("0 20 * * 5L", "cron(0 20 ? * 6L *)"),
        ("0 0 1-31 * MON", "cron(0 0 * * ? *)"),  # Debian: both restricted means OR
        ("0 0 */2 * 0-6", "cron(0 0 1/2 * ? *)"),
        ("5,25,45 1,3,5 * * *", "cron(5/20 1,3,5 * * ? *)"),
    ],
)
def test_translates_each_construct_exactly(expr: str, aws: str) -> None:
    assert _aws(expr) == aws


@pytest.mark.parametrize(
    ("expr", "construct"),
    [
        ("0 12 5 * MON", "day-of-month OR day-of-week"),
        ("0 12 */2 * MON", "day-of-month AND day-of-week"),
        ("0 12 1,L * *", "`L` combined with other days of the month"),
        ("0 12 * * MON#1,FRI", "combined with other days of the week"),
    ],
)
def test_refuses_what_aws_cron_cannot_say_naming_job_target_and_construct(
    expr: str, construct: str
) -> None:
    with pytest.raises(UnsupportedScheduleError) as err:
        _aws(expr)
    assert isinstance(err.value, ConfigError)
    message = str(err.value)
    assert "job 'j'" in message and "EventBridge Scheduler" in message and construct in message


def test_intervals_export_when_slot_aligned_and_refuse_otherwise() -> None:
    registry = Registry()
    aligned = registry.add_job(every(minutes=20), lambda db, now: None, name="twenty")
    daily = registry.add_job(every(days=1), lambda db, now: None, name="daily")
    odd = registry.add_job(every(minutes=7), lambda db, now: None, name="seven")
    long = registry.add_job(every(days=2), lambda db, now: None, name="two_days")
    target = eventbridge.EcsTarget("c", "t", "app", "r")
    props = eventbridge.schedule_properties(aligned, target)
    assert props["ScheduleExpression"] == "cron(0/20 * * * ? *)"
    assert props["ScheduleExpressionTimezone"] == "UTC"
    assert eventbridge.schedule_properties(daily, target)["ScheduleExpression"] == (
        "cron(0 0 * * ? *)"
    )
    for job in (odd, long):
        with pytest.raises(UnsupportedScheduleError, match="oncely worker"):
            eventbridge.schedule_properties(job, target)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@example(expr="30 2 * * *", tz="America/New_York", start=STARTS[1], shift=0)
@example(expr="*/30 * * * *", tz="Europe/Madrid", start=STARTS[6], shift=6)
@given(
    expr=cron_expressions,
    tz=zones,
    start=st.sampled_from(STARTS),
    shift=st.integers(0, 12),
)
def test_exported_aws_expression_fires_at_oncelys_slots(
    expr: str, tz: str, start: datetime, shift: int
) -> None:
    schedule = cron(expr, tz)
    try:
        schedule.check()
    except ConfigError:
        assume(False)
    registry = Registry()
    job = registry.add_job(schedule, lambda db, now: None, name="prop")
    fields = cron_fields(expr)
    try:
        text = eventbridge.aws_cron(job, fields)
    except UnsupportedScheduleError:
        event("refused")
        # Refused only for what AWS cron cannot say.
        assert (
            fields.rule in (DayRule.AND, DayRule.OR)
            or (fields.dom_special and (fields.days or (fields.last_day and fields.last_weekday)))
            or len(fields.weekdays) + len(fields.last_weekdays) + len(fields.nth_weekdays) > 1
        )
        return
    event("exported")
    begin = start + timedelta(hours=shift)
    # A window of at most 200 slots or 62 days, whichever comes first.
    ours: list[datetime] = []
    for slot in schedule.slots_after(begin):
        if len(ours) == 200 or slot > begin + timedelta(days=62):
            break
        ours.append(slot.astimezone(UTC))
    end = ours[-1] if len(ours) == 200 else begin + timedelta(days=62)
    theirs = AwsCron(text).fires(schedule.zone, begin, end)
    # The AWS string means exactly the cron fields under AWS's DST rule ...
    assert theirs == model_slots(fields, schedule.zone, DstModel.WALL_ONCE, begin, end)
    # ... which are oncely's slots, except at DST changes, and then export warns.
    if theirs != ours:
        event("dst difference")
        assert dst_warning(job, schedule, "EventBridge Scheduler", DstModel.WALL_ONCE, begin)
        changes = [
            t
            for t in (
                begin + timedelta(minutes=15 * i)
                for i in range(int((end - begin) / timedelta(minutes=15)) + 1)
            )
            if t.astimezone(schedule.zone).utcoffset()
            != (t + timedelta(minutes=15)).astimezone(schedule.zone).utcoffset()
        ]
        for t in set(theirs) ^ set(ours):
            assert any(abs(t - c) <= timedelta(hours=4) for c in changes), t


def test_cloudformation_output_passes_cfn_lint(tmp_path: pytest.TempPathFactory) -> None:
    if shutil.which("cfn-lint") is None:
        pytest.fail("cfn-lint is missing: pip install -e '.[test]'")
    result = oncely(
        "export",
        "eventbridge",
        *ARGS,
        "--job",
        "leaderboard_close",
        "--job",
        "weekday_mornings",
        "--job",
        "quarter_hours",
        "--job",
        "month_end",
        "--job",
        "second_tuesday",
        "--job",
        "every_five_minutes",
        "--job",
        "nightly_230",
    )
    assert result.returncode == 0, result.stderr
    good, broken = tmp_path / "schedules.yaml", tmp_path / "broken.yaml"  # type: ignore[operator]
    good.write_text(result.stdout)
    # A broken template fails the same check, so the lint is not a no-op (one cfn-lint start).
    broken.write_text(result.stdout.replace("Mode: 'OFF'", "Mode: SOMETIMES"))
    lint = subprocess.run(["cfn-lint", str(good), str(broken)], capture_output=True, text=True)
    report = lint.stdout + lint.stderr
    assert str(broken) in report
    assert str(good) not in report, report
    assert "cron(0 18 ? * 6 *)" in result.stdout
    assert "ScheduleExpressionTimezone: America/Mexico_City" in result.stdout
    assert "<aws.scheduler.scheduled-time>" in result.stdout
    assert result.stdout.count("AWS::Scheduler::Schedule") == 7
    # The New York 02:30 job is exported, with a warning naming it and the gap.
    assert "warning: job 'nightly_230'" in result.stderr
    assert "skips" in result.stderr


def test_json_format_is_one_document_of_create_schedule_requests() -> None:
    result = oncely(
        "export", "eventbridge", "--format", "json", *ARGS, "--job", "leaderboard_close"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    (schedule,) = data["schedules"]
    assert schedule["ScheduleExpression"] == "cron(0 18 ? * 6 *)"
    assert schedule["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert schedule["Target"]["RetryPolicy"]["MaximumRetryAttempts"] == 3
    overrides = json.loads(schedule["Target"]["Input"])
    assert overrides["containerOverrides"][0]["command"] == [
        "oncely",
        "--app",
        "exportapp",
        "run",
        "leaderboard_close",
        "--now",
        "<aws.scheduler.scheduled-time>",
    ]


def test_refusal_exits_2_names_job_target_construct_and_prints_nothing() -> None:
    result = oncely_process("export", "eventbridge", *ARGS, "--job", "fifth_or_monday")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "job 'fifth_or_monday'" in result.stderr
    assert "EventBridge Scheduler cannot express day-of-month OR day-of-week" in result.stderr
    interval = oncely("export", "eventbridge", *ARGS, "--job", "every_seven_minutes")
    assert interval.returncode == 2 and interval.stdout == ""
    assert "every(seconds=420)" in interval.stderr and "oncely worker" in interval.stderr
