"""`--metrics-port` / `--metrics-host`, as long-running commands get them."""

from __future__ import annotations

import urllib.request

import click
import pytest
from click.testing import CliRunner
from prometheus_client import REGISTRY

from oncely import events, metrics
from oncely.cli.metrics import metrics_options, start_metrics


def command(scraped: list[str]) -> click.Command:
    @click.command()
    @metrics_options
    def serve_once(metrics_port: int | None, metrics_host: str) -> None:
        server = start_metrics(metrics_port, metrics_host)
        if server is None:
            click.echo("no metrics")
            return
        try:
            events.emit("run.skipped", "already ran, skipping", job="options_job", key="k")
            with urllib.request.urlopen(server.url, timeout=10) as response:
                scraped.append(response.read().decode())
            click.echo(server.url)
        finally:
            server.close()

    return serve_once


@pytest.fixture
def default_registry():  # type: ignore[no-untyped-def]
    yield
    metrics.uninstall(REGISTRY)


def test_metrics_port_serves_on_loopback_by_default(default_registry: None) -> None:
    scraped: list[str] = []
    result = CliRunner().invoke(command(scraped), ["--metrics-port", "0"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("http://127.0.0.1:")
    assert 'oncely_duplicates_suppressed_total{job="options_job",kind="slot"} 1.0' in scraped[0]


def test_no_metrics_port_serves_nothing() -> None:
    result = CliRunner().invoke(command([]), [])
    assert result.exit_code == 0 and result.output.strip() == "no metrics"


def test_metrics_host_and_port_from_the_environment(default_registry: None) -> None:
    scraped: list[str] = []
    result = CliRunner().invoke(
        command(scraped), [], env={"ONCELY_METRICS_PORT": "0", "ONCELY_METRICS_HOST": "127.0.0.1"}
    )
    assert result.exit_code == 0, result.output
    assert scraped and "oncely_runs_total" in scraped[0]
