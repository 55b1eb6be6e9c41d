"""`oncely export TARGET`: write an external scheduler's configuration from the registry.

Each target prints its configuration on stdout (or one JSON document with --format json) and
any DST warnings on stderr. A job whose schedule the target cannot express exactly is left out
with a warning naming it and why (exit 0); with --strict, or when no job is left, nothing is
printed and the exit code is 2.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..clock import utcnow
from ..errors import BadInputError
from .common import Context, handled

if TYPE_CHECKING:  # each target's module is imported by its command: `--help` needs none
    from ..export.base import Export, UnsupportedScheduleError
    from ..registry import Job

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


_strict_option = click.option(
    "--strict",
    is_flag=True,
    help="Refuse (exit 2, nothing written) if any job cannot be expressed, instead of "
    "leaving it out with a warning.",
)


def _program() -> str:
    """The full path of this `oncely` (cron and systemd start with a bare PATH)."""
    beside = Path(sys.executable).parent / "oncely"
    if beside.is_file():
        return str(beside)
    found = shutil.which("oncely")
    return str(Path(found).absolute()) if found else "oncely"


_program_option = click.option(
    "--oncely",
    "executable",
    metavar="PATH",
    help="The oncely program the entries start [default: this one's full path].",
)


def _reason(exc: UnsupportedScheduleError) -> str:
    return str(exc).split(": ", 1)[1] if ": " in str(exc) else str(exc)


def _exportable(
    obj: Context, names: Sequence[str], strict: bool, build: Callable[[Sequence[Job]], Export]
) -> Export:
    """Build the target's output for the jobs it can express; refuse or warn about the rest."""
    from ..export.base import partition

    jobs = _jobs(obj, names)
    kept, refused = partition(jobs, build)
    if refused and (strict or not kept):
        why = "; ".join(str(exc) for exc in refused)
        if len(refused) == 1 and not kept:
            raise BadInputError(f"{why}; nothing written (pick the jobs to export with --job NAME)")
        left = "--strict" if strict else "no job left"
        raise BadInputError(
            f"{len(refused)} of {len(jobs)} jobs cannot be exported, nothing written ({left}): "
            f"{why}; pick the jobs to export with --job NAME"
        )
    result = build(kept)
    for exc in refused:
        result.warnings.insert(
            0,
            f"skipped job {exc.job!r}: {_reason(exc)} "
            "(the others are exported; pick jobs with --job NAME, or refuse with --strict)",
        )
    return result


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
@_strict_option
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
    strict: bool,
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
    from ..export import eventbridge

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
    now = utcnow()
    _emit(
        _exportable(obj, job_names, strict, lambda jobs: eventbridge.export(jobs, target, fmt, now))
    )


@export_group.command("kubernetes")
@_jobs_option
@_strict_option
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
    strict: bool,
    fmt: str,
    image: str,
    namespace: str | None,
    starting_deadline: int,
    backoff_limit: int,
    service_account: str | None,
    env_from_secret: str | None,
) -> None:
    """batch/v1 CronJobs whose pods run `oncely run JOB`."""
    from ..export import kubernetes

    pod = kubernetes.PodSpec(
        image=image,
        namespace=namespace,
        app_spec=obj.app_spec,
        starting_deadline=starting_deadline,
        backoff_limit=backoff_limit,
        service_account=service_account,
        env_from_secret=env_from_secret,
    )
    now = utcnow()
    _emit(_exportable(obj, job_names, strict, lambda jobs: kubernetes.export(jobs, pod, fmt, now)))


@export_group.command("crontab")
@_jobs_option
@_strict_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@_program_option
@click.option(
    "--working-directory",
    metavar="DIR",
    help="Directory each line changes to first [default: the current one].",
)
@click.pass_obj
@handled
def export_crontab(
    obj: Context,
    job_names: tuple[str, ...],
    strict: bool,
    fmt: str,
    executable: str | None,
    working_directory: str | None,
) -> None:
    """A crontab with a CRON_TZ line per zone."""
    from ..export import crontab

    program, where, now = executable or _program(), working_directory or os.getcwd(), utcnow()

    def build(jobs: Sequence[Job]) -> Export:
        return crontab.export(jobs, program, obj.app_spec, fmt, now, where)

    _emit(_exportable(obj, job_names, strict, build))


@export_group.command("systemd")
@_jobs_option
@_strict_option
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@_program_option
@click.option(
    "--working-directory",
    metavar="DIR",
    help="WorkingDirectory= of the services [default: the current directory].",
)
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
    strict: bool,
    fmt: str,
    executable: str | None,
    working_directory: str | None,
    environment_file: str | None,
    user: str | None,
    output_dir: Path | None,
) -> None:
    """A .timer + .service pair per job (OnCalendar= in the job's zone, Persistent=true)."""
    from ..export import systemd

    program, where, now = executable or _program(), working_directory or os.getcwd(), utcnow()
    unit = systemd.Unit(program, obj.app_spec, where, environment_file, user)
    result = _exportable(obj, job_names, strict, lambda jobs: systemd.export(jobs, unit, fmt, now))
    if output_dir is None:
        _emit(result)
        return
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, body in systemd.files_of(result).items():
        (output_dir / name).write_text(body)
        click.echo(f"wrote {output_dir / name}")
