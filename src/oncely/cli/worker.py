"""`oncely worker`: the embedded scheduler, safe to run in every replica."""

from __future__ import annotations

import asyncio

import click

from ..queue import DEFAULT_CONCURRENCY
from ..worker import DEFAULT_SHUTDOWN_TIMEOUT
from . import Context, Finite, handled
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
    default=DEFAULT_SHUTDOWN_TIMEOUT,
    show_default=True,
    type=Finite(0),
    metavar="SECONDS",
    help="On SIGTERM/SIGINT, how long running attempts may finish before they are cancelled "
    "(rolled back; their tasks handed back at once). Keep it below the platform's grace period.",
)
@click.option(
    "--startup-wait",
    default=60.0,
    show_default=True,
    type=Finite(0),
    metavar="SECONDS",
    help="How long to wait at start for an unreachable database before exiting with 2.",
)
@click.option(
    "--concurrency",
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    type=click.IntRange(min=0),
    help="Task transactions to run at once in this process (0: run no tasks here).",
)
@click.option(
    "--lease",
    type=Finite(0, open_min=True),
    metavar="SECONDS",
    help="How long a task stays leased to this worker without a heartbeat "
    "[default: Oncely(lease=...), 30].",
)
@click.option("--queues", metavar="A,B", help="Run only tasks of these queues (default: all).")
@metrics_options
@click.pass_obj
@handled
def worker(
    obj: Context,
    jobs: str | None,
    shutdown_timeout: float,
    startup_wait: float,
    concurrency: int,
    lease: float | None,
    queues: str | None,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run the app's due job slots and its tasks until SIGTERM/SIGINT (then exit 0)."""
    names = _job_list(jobs)
    if names is not None:
        for name in names:
            obj.app.registry.job(name)  # unknown job: exit 2 before touching the database
    app = obj.app
    start_metrics(metrics_port, metrics_host)

    async def go() -> None:
        try:
            await app.work(
                jobs=names,
                shutdown_timeout=shutdown_timeout,
                startup_wait=startup_wait,
                handle_signals=True,
                concurrency=concurrency,
                lease=lease,
                queues=_job_list(queues),
            )
        finally:
            await app.aclose()

    asyncio.run(go())
