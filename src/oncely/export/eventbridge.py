"""EventBridge Scheduler: one `AWS::Scheduler::Schedule` per job, running `oncely run` on ECS.

AWS cron has six fields (minute hour day-of-month month day-of-week year), numbers weekdays
1-7 with SUN=1, and needs `?` in exactly one of the two day fields, so it cannot combine a
day-of-month with a day-of-week (neither cron's OR nor an AND). `L`, `LW` and `#` exist but
stand alone in their field. The container is started with the slot's nominal time
(`<aws.scheduler.scheduled-time>`), so a late or retried invocation runs the slot that was due.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..registry import Job
from .base import (
    ALL_DAYS,
    ALL_HOURS,
    ALL_MINUTES,
    ALL_MONTHS,
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
    progression,
    resource_name,
    to_yaml,
)

TARGET = "EventBridge Scheduler"
SCHEDULED_TIME = "<aws.scheduler.scheduled-time>"


@dataclass(frozen=True)
class EcsTarget:
    """Where and how each slot runs: an ECS RunTask of the app's task definition."""

    cluster: str
    task_definition: str
    container: str
    role_arn: str
    subnets: Sequence[str] = ()
    security_groups: Sequence[str] = ()
    launch_type: str = "FARGATE"
    assign_public_ip: bool = False
    retries: int = 3
    max_event_age: int = 3600
    app_spec: str | None = None


def _refuse(job: Job, construct: str, hint: str = "") -> UnsupportedScheduleError:
    return UnsupportedScheduleError(job.name, TARGET, construct, hint)


def aws_cron(job: Job, fields: CronFields) -> str:
    """The job's fields in AWS's 6-field syntax, meaning exactly what cronsim matches."""
    minute = _field(fields.minutes, ALL_MINUTES)
    hour = _field(fields.hours, ALL_HOURS)
    month = _field(fields.months, ALL_MONTHS)
    if fields.rule is DayRule.ALL:
        dom, dow = "*", "?"
    elif fields.rule is DayRule.DOM:
        dom, dow = _aws_dom(job, fields), "?"
    elif fields.rule is DayRule.DOW:
        dom, dow = "?", _aws_dow(job, fields)
    else:
        raise _refuse(
            job,
            f"{fields.rule.value} (AWS cron needs `?` in one of the two day fields)",
            "split it into two jobs, one per day field",
        )
    return f"cron({minute} {hour} {dom} {month} {dow} *)"


def _field(values: frozenset[int], full: frozenset[int]) -> str:
    """A numeric field; an arithmetic run to the field's end is AWS's `start/step`."""
    if values == full:
        return "*"
    steps = progression(values, max(full))
    return f"{steps[0]}/{steps[1]}" if steps else compact(values)


def _aws_dom(job: Job, fields: CronFields) -> str:
    specials = [s for s, on in (("L", fields.last_day), ("LW", fields.last_weekday)) if on]
    if specials and (fields.days or len(specials) > 1):
        raise _refuse(job, f"`{specials[0]}` combined with other days of the month")
    return specials[0] if specials else _field(fields.days, ALL_DAYS)


def _aws_dow(job: Job, fields: CronFields) -> str:
    terms = [f"{d + 1}L" for d in sorted(fields.last_weekdays)] + [
        f"{d + 1}#{n}" for d, n in sorted(fields.nth_weekdays)
    ]
    if terms and (fields.weekdays or len(terms) > 1):
        raise _refuse(job, f"`{terms[0]}` (AWS numbering) combined with other days of the week")
    return terms[0] if terms else compact(d + 1 for d in fields.weekdays)


def schedule_properties(job: Job, target: EcsTarget) -> dict[str, Any]:
    """The schedule as CloudFormation properties (also the CreateSchedule request shape)."""
    schedule = cron_schedule(job, TARGET)
    network: dict[str, Any] = {}
    if target.subnets:
        vpc: dict[str, Any] = {"Subnets": list(target.subnets)}
        if target.security_groups:
            vpc["SecurityGroups"] = list(target.security_groups)
        vpc["AssignPublicIp"] = "ENABLED" if target.assign_public_ip else "DISABLED"
        network = {"NetworkConfiguration": {"AwsvpcConfiguration": vpc}}
    overrides = {
        "containerOverrides": [
            {
                "name": target.container,
                "command": command(job.name, target.app_spec, SCHEDULED_TIME),
            }
        ]
    }
    return {
        "Name": resource_name(job.name, "oncely-", "0-9a-zA-Z_.-", 64),
        "Description": f"oncely job {job.name}: {job.schedule.describe()}"[:512],
        "ScheduleExpression": aws_cron(job, cron_fields(schedule.expr)),
        "ScheduleExpressionTimezone": schedule.tz,
        "FlexibleTimeWindow": {"Mode": "OFF"},
        "State": "ENABLED",
        "Target": {
            "Arn": target.cluster,
            "RoleArn": target.role_arn,
            "RetryPolicy": {
                "MaximumRetryAttempts": target.retries,
                "MaximumEventAgeInSeconds": target.max_event_age,
            },
            "EcsParameters": {
                "TaskDefinitionArn": target.task_definition,
                "TaskCount": 1,
                "LaunchType": target.launch_type,
                **network,
            },
            "Input": json.dumps(overrides, separators=(",", ":")),
        },
    }


def logical_id(job: Job) -> str:
    """A CloudFormation logical ID (alphanumeric) for the job's schedule."""
    name = resource_name(job.name, "", "0-9a-zA-Z", 246)
    return "OncelySchedule" + "".join(p[:1].upper() + p[1:] for p in name.split("-"))


def export(jobs: Sequence[Job], target: EcsTarget, fmt: str, now: datetime) -> Export:
    """A CloudFormation template (YAML) or one JSON document of CreateSchedule requests."""
    schedules = [(job, schedule_properties(job, target)) for job in jobs]
    warnings = [
        w
        for job in jobs
        if (w := dst_warning(job, cron_schedule(job, TARGET), TARGET, DstModel.WALL_ONCE, now))
    ]
    if fmt == "json":
        data: dict[str, Any] = {"schedules": [props for _, props in schedules]}
        return Export(json.dumps(data, indent=2), data, warnings)
    template = {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": "oncely jobs on EventBridge Scheduler (generated by `oncely export`)",
        "Resources": {
            logical_id(job): {"Type": "AWS::Scheduler::Schedule", "Properties": props}
            for job, props in schedules
        },
    }
    return Export(to_yaml(template) + "\n", template, warnings)
