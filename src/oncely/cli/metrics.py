"""`--metrics-port` / `--metrics-host` for long-running commands (`oncely worker`).

Usage on a command: decorate it with `@metrics_options` and call
`start_metrics(metrics_port, metrics_host)` before its loop; the server runs in a daemon
thread for the life of the process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:  # imported when a server starts, not by every command's options
    from .. import metrics

F = TypeVar("F", bound=Callable[..., Any])


def metrics_options(func: F) -> F:
    """Add --metrics-port and --metrics-host to a click command."""
    func = click.option(
        "--metrics-host",
        default="127.0.0.1",
        show_default=True,
        envvar="ONCELY_METRICS_HOST",
        metavar="HOST",
        help="Address for /metrics; 127.0.0.1 keeps it on this machine [env ONCELY_METRICS_HOST].",
    )(func)
    func = click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        envvar="ONCELY_METRICS_PORT",
        metavar="PORT",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics "
        "(needs prometheus-client: the metrics extra) [env ONCELY_METRICS_PORT].",
    )(func)
    return func


def start_metrics(port: int | None, host: str) -> metrics.Server | None:
    """Serve /metrics if a port was given; None otherwise. Errors are ConfigErrors (exit 2)."""
    if port is None:
        return None
    from .. import metrics

    server = metrics.serve(port, host)
    click.echo(f"serving metrics at {server.url}", err=True)
    return server
