"""`oncely worker`: the embedded scheduler, safe to run in every replica."""

from __future__ import annotations

import click

from .. import config
from .common import Context, Finite, handled
from .metrics import metrics_options, start_metrics


def _job_list(value: str | None) -> list[str] | None:
    """A comma-separated option as a list (None when not given)."""
    if not value:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


@click.command("worker")
@click.option("--jobs", metavar="A,B", help="Run only these jobs (default: every job).")
@click.option(
    "--shutdown-timeout",
    default=config.SHUTDOWN_TIMEOUT,
    show_default=True,
    type=Finite(0),
    metavar="SECONDS",
    help="On SIGTERM/SIGINT, how long running attempts may finish before they are cancelled "
    "(rolled back; their tasks handed back at once). Keep it below the platform's grace period.",
)
@click.option(
    "--startup-wait",
    default=config.STARTUP_WAIT,
    show_default=True,
    type=Finite(0),
    metavar="SECONDS",
    help="How long to wait at start for an unreachable database before exiting with 2.",
)
@click.option(
    "--concurrency",
    default=config.CONCURRENCY,
    show_default=True,
    type=click.IntRange(min=0),
    help="Tasks to run at once in this process (0: run no tasks here).",
)
@click.option(
    "--pool-size",
    default=config.POOL_SIZE,
    show_default=True,
    type=click.IntRange(min=1),
    help="Database connections for the tasks: a task holds one from its first statement to "
    "its commit; one that makes no statement holds none.",
)
@click.option(
    "--group",
    default=config.GROUP,
    show_default=True,
    type=click.IntRange(min=1, max=config.GROUP_MAX),
    metavar="N",
    help="With a backlog, run up to N async tasks one after another in one transaction, a "
    "savepoint each, one COMMIT for all (Postgres; tasks without a timeout). A COMMIT that "
    "fails runs every task of its group again; 1: each task in its own transaction.",
)
@click.option(
    "--lease",
    type=Finite(0, open_min=True),
    metavar="SECONDS",
    help="How long a task stays leased to this worker without a heartbeat "
    f"[default: Oncely(lease=...), {config.LEASE:g}].",
)
@click.option("--queues", metavar="A,B", help="Run only tasks of these queues (default: all).")
@click.option(
    "--schedule-poll",
    default=config.SCHEDULE_POLL,
    show_default=True,
    type=Finite(0),
    metavar="SECONDS",
    help="How often to look for due schedules kept as data (`oncely schedules`): how soon a "
    "change reaches this worker; 0: run none here.",
)
@metrics_options
@click.pass_obj
@handled
def worker(
    obj: Context,
    jobs: str | None,
    shutdown_timeout: float,
    startup_wait: float,
    concurrency: int,
    pool_size: int,
    group: int,
    lease: float | None,
    queues: str | None,
    schedule_poll: float,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run the app's due job slots and its tasks until SIGTERM/SIGINT (then exit 0)."""
    names = _job_list(jobs)
    if names is not None:
        for name in names:
            obj.app.registry.job(name)  # unknown job: exit 2 before touching the database
    start_metrics(metrics_port, metrics_host)

    obj.call(
        lambda app: app.work(
            jobs=names,
            shutdown_timeout=shutdown_timeout,
            startup_wait=startup_wait,
            handle_signals=True,
            concurrency=concurrency,
            pool_size=pool_size,
            group=group,
            lease=lease,
            queues=_job_list(queues),
            schedule_poll=schedule_poll,
        )
    )
