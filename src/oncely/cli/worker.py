"""`oncely worker`: the embedded scheduler, safe to run in every replica."""

from __future__ import annotations

import asyncio

import click

from . import Context, handled
from .metrics import metrics_options, start_metrics


def _job_list(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


@click.command("worker")
@click.option("--jobs", metavar="A,B", help="Run only these jobs (default: every job).")
@click.option(
    "--shutdown-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="On SIGTERM/SIGINT, how long running attempts may finish before they are cancelled.",
)
@click.option(
    "--startup-wait",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="How long to wait at start for an unreachable database before exiting with 2.",
)
@metrics_options
@click.pass_obj
@handled
def worker(
    obj: Context,
    jobs: str | None,
    shutdown_timeout: float,
    startup_wait: float,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run the due slots of the app's jobs until SIGTERM/SIGINT (then exit 0)."""
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
            )
        finally:
            await app.aclose()

    asyncio.run(go())
