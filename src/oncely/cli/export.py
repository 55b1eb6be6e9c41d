"""`oncely export TARGET`: write an external scheduler's configuration from the registry.

Each target prints its configuration on stdout (or one JSON document with --format json) and
any DST warnings on stderr; a schedule the target cannot express exactly is refused (exit 2)
and nothing is printed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from ..clock import utcnow
from ..errors import BadInputError
from ..export import crontab, eventbridge, kubernetes, systemd
from ..export.base import Export
from ..registry import Job
from . import Context, handled

_jobs_option = click.option(
    "--job",
    "job_names",
    multiple=True,
    metavar="NAME",
    help="Export only this job (repeatable; default: every job).",
)


def _jobs(obj: Context, names: Sequence[str]) -> list[Job]:
    registry = obj.app.registry
    if names:
        return [registry.job(name) for name in dict.fromkeys(names)]
    jobs = list(registry)
    if not jobs:
        raise BadInputError("no jobs to export: pass --app MODULE:ATTR (or set ONCELY_APP)")
    return jobs


def _emit(result: Export) -> None:
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(result.text, nl=not result.text.endswith("\n"))


def _csv(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


@click.group("export")
def export_group() -> None:
    """Write an external scheduler's configuration for the jobs (one source of truth)."""


@export_group.command("eventbridge")
@_jobs_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["cloudformation", "json"]),
    default="cloudformation",
    show_default=True,
)
@click.option("--cluster", required=True, metavar="ARN", help="ECS cluster ARN.")
@click.option("--task-definition", required=True, metavar="ARN", help="Task definition ARN.")
@click.option("--container", required=True, help="Container (in the task) that runs oncely.")
@click.option("--role-arn", required=True, metavar="ARN", help="Role the scheduler assumes.")
@click.option("--subnets", metavar="ID,...", help="Subnets for awsvpc networking.")
@click.option("--security-groups", metavar="ID,...", help="Security groups for awsvpc.")
@click.option("--launch-type", type=click.Choice(["FARGATE", "EC2", "EXTERNAL"]), default="FARGATE")
@click.option("--assign-public-ip", is_flag=True, help="Give the task a public IP.")
@click.option("--retries", type=click.IntRange(0, 185), default=3, show_default=True)
@click.option(
    "--max-event-age",
    type=click.IntRange(60, 86400),
    default=3600,
    show_default=True,
    help="Seconds the scheduler keeps retrying a slot.",
)
@click.pass_obj
@handled
def export_eventbridge(
    obj: Context,
    job_names: tuple[str, ...],
    fmt: str,
    cluster: str,
    task_definition: str,
    container: str,
    role_arn: str,
    subnets: str | None,
    security_groups: str | None,
    launch_type: str,
    assign_public_ip: bool,
    retries: int,
    max_event_age: int,
) -> None:
    """EventBridge Scheduler schedules that run `oncely run JOB --now <scheduled-time>` on ECS."""
    target = eventbridge.EcsTarget(
        cluster=cluster,
        task_definition=task_definition,
        container=container,
        role_arn=role_arn,
        subnets=_csv(subnets),
        security_groups=_csv(security_groups),
        launch_type=launch_type,
        assign_public_ip=assign_public_ip,
        retries=retries,
        max_event_age=max_event_age,
        app_spec=obj.app_spec,
    )
    _emit(eventbridge.export(_jobs(obj, job_names), target, fmt, utcnow()))


@export_group.command("kubernetes")
@_jobs_option
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml")
@click.option("--image", required=True, help="Container image with your app and oncely.")
@click.option("--namespace", help="Namespace of the CronJobs.")
@click.option("--starting-deadline", type=click.IntRange(10), default=300, show_default=True)
@click.option("--backoff-limit", type=click.IntRange(0, 10), default=2, show_default=True)
@click.option("--service-account", help="Service account of the pods.")
@click.option("--env-from-secret", metavar="NAME", help="Secret with ONCELY_DATABASE_URL etc.")
@click.pass_obj
@handled
def export_kubernetes(
    obj: Context,
    job_names: tuple[str, ...],
    fmt: str,
    image: str,
    namespace: str | None,
    starting_deadline: int,
    backoff_limit: int,
    service_account: str | None,
    env_from_secret: str | None,
) -> None:
    """batch/v1 CronJobs whose pods run `oncely run JOB`."""
    pod = kubernetes.PodSpec(
        image=image,
        namespace=namespace,
        app_spec=obj.app_spec,
        starting_deadline=starting_deadline,
        backoff_limit=backoff_limit,
        service_account=service_account,
        env_from_secret=env_from_secret,
    )
    _emit(kubernetes.export(_jobs(obj, job_names), pod, fmt, utcnow()))


@export_group.command("crontab")
@_jobs_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--oncely", "executable", default="oncely", show_default=True, help="Command path.")
@click.pass_obj
@handled
def export_crontab(obj: Context, job_names: tuple[str, ...], fmt: str, executable: str) -> None:
    """A crontab with a CRON_TZ line per zone."""
    result = crontab.export(_jobs(obj, job_names), executable, obj.app_spec, fmt, utcnow())
    _emit(result)


@export_group.command("systemd")
@_jobs_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--oncely", "executable", default="oncely", show_default=True, help="Command path.")
@click.option("--working-directory", metavar="DIR", help="WorkingDirectory= of the services.")
@click.option("--environment-file", metavar="FILE", help="EnvironmentFile= of the services.")
@click.option("--user", help="User= of the services.")
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the unit files here instead of printing them.",
)
@click.pass_obj
@handled
def export_systemd(
    obj: Context,
    job_names: tuple[str, ...],
    fmt: str,
    executable: str,
    working_directory: str | None,
    environment_file: str | None,
    user: str | None,
    output_dir: Path | None,
) -> None:
    """A .timer + .service pair per job (OnCalendar= in the job's zone, Persistent=true)."""
    unit = systemd.Unit(executable, obj.app_spec, working_directory, environment_file, user)
    result = systemd.export(_jobs(obj, job_names), unit, fmt, utcnow())
    if output_dir is None:
        _emit(result)
        return
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, body in systemd.files_of(result).items():
        (output_dir / name).write_text(body)
        click.echo(f"wrote {output_dir / name}")
