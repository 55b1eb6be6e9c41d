"""Metrics: real runs on SQLite and Postgres, scraped over HTTP from `oncely.metrics.serve`."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from oncely import ConfigError, Oncely, RetryPolicy, cron, events, metrics

FRIDAY = datetime(2026, 11, 27, 18, 0, tzinfo=timezone(timedelta(hours=-6)))


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    yield registry
    metrics.uninstall(registry)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample at `url`, by name and sorted labels."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        body = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def build_app(db_url: str, release: asyncio.Event, holding: asyncio.Event) -> Oncely:
    app = Oncely(db_url)
    friday = cron("0 18 * * FRI", tz="America/Mexico_City")

    @app.job(friday)
    async def close(db, now):  # type: ignore[no-untyped-def]
        await db.execute(sa.text("INSERT INTO effects (what) VALUES ('paid')"))

    @app.job(friday, retry=RetryPolicy(attempts=1))  # given up at its first failure
    async def explode(db, now):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    @app.job(friday)
    async def hold(db, now):  # type: ignore[no-untyped-def]
        holding.set()
        await release.wait()

    return app


async def real_runs(db_url: str) -> int:
    """ran 1, skipped 2 (close); failed 1 + given up 1 (explode); ran 1 + busy 1 (hold);
    the effects."""
    release, holding = asyncio.Event(), asyncio.Event()
    app = build_app(db_url, release, holding)
    await app.migrate()
    async with app.store.engine.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE effects (what varchar(10))"))
    try:
        for minute in range(3):
            await app.run("close", FRIDAY + timedelta(minutes=minute))
        assert (await app.attempt("explode", FRIDAY)).status.value == "failed"
        assert (await app.attempt("explode", FRIDAY)).status.value == "given_up"
        holder = asyncio.create_task(app.run("hold", FRIDAY))
        await asyncio.wait_for(holding.wait(), 30)
        loser = await app.run("hold", FRIDAY)
        assert loser.status.value == "busy"
        release.set()
        assert (await asyncio.wait_for(holder, 30)).status.value == "ran"
        async with app.store.engine.connect() as conn:
            return int((await conn.execute(sa.text("SELECT count(*) FROM effects"))).scalar_one())
    finally:
        await app.aclose()


def test_duplicates_are_observable_in_metrics_scraped_over_http(
    db_url: str, registry: CollectorRegistry
) -> None:
    server = metrics.serve(0, registry=registry)
    try:
        assert server.host == "127.0.0.1" and server.url.startswith("http://127.0.0.1:")
        assert asyncio.run(real_runs(db_url)) == 1  # one effect, however many attempts
        samples = scrape(server.url)
    finally:
        server.close()

    def runs(job: str, status: str) -> float:
        return samples.get(("oncely_runs_total", (("job", job), ("status", status))), 0.0)

    assert runs("close", "ran") == 1
    assert runs("close", "skipped") == 2
    assert runs("explode", "failed") == 1 and runs("explode", "given_up") == 1
    assert runs("hold", "busy") == 1 and runs("hold", "ran") == 1
    dup = ("oncely_duplicates_suppressed_total", (("job", "close"), ("kind", "slot")))
    assert samples[dup] == 2
    duration = ("oncely_run_duration_seconds_count", (("job", "close"), ("status", "ran")))
    assert samples[duration] == 1
    assert (
        samples[("oncely_run_duration_seconds_count", (("job", "explode"), ("status", "failed")))]
        == 1
    )
    # Fire latency: the runs happened long after their nominal Friday slot (and not before).
    latency_sum = samples[("oncely_fire_latency_seconds_sum", (("job", "close"),))]
    assert samples[("oncely_fire_latency_seconds_count", (("job", "close"),))] == 1
    lateness = (datetime.now(timezone.utc) - FRIDAY).total_seconds()
    assert lateness - 120 < latency_sum <= lateness


def test_every_mapped_event_moves_its_metrics(registry: CollectorRegistry) -> None:
    """The worker's, the queue's and the once-handlers' events, as they emit them."""
    installed = metrics.install(registry)
    assert metrics.install(registry) is installed  # idempotent: no double counting
    emitted = [
        ("run.missed", {"job": "digest", "count": 3, "first": "2026-11-27T18:00:00-06:00"}),
        ("run.missed", {"job": "digest", "count": 1}),
        ("run.overlap_skipped", {"job": "digest"}),
        ("task.enqueued", {"task": "charge", "key": "charge:42"}),
        ("task.duplicate", {"task": "charge", "key": "charge:42"}),
        ("task.started", {"task": "charge", "attempt": 1}),
        ("task.retry", {"task": "charge", "attempt": 1, "duration_ms": 12.5}),
        ("task.started", {"task": "charge", "attempt": 2}),
        ("task.lease_lost", {"task": "charge"}),
        ("task.succeeded", {"task": "charge", "duration_ms": 30.0}),
        ("task.discarded", {"task": "refund"}),
        ("task.dead", {"task": "refund"}),
        ("effect.ran", {"effect": "send_email", "key": "k"}),
        ("effect.skipped", {"effect": "send_email", "key": "k"}),
        ("an.unknown.event", {"job": "x"}),
    ]
    for name, fields in emitted:
        events.emit(name, "test", **fields)
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return values.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("oncely_slots_missed_total", job="digest") == 4  # by each report's count
    assert value("oncely_slots_overlap_skipped_total", job="digest") == 1
    assert value("oncely_tasks_total", task="charge", state="enqueued") == 1
    assert value("oncely_tasks_total", task="charge", state="started") == 2
    assert value("oncely_tasks_total", task="charge", state="succeeded") == 1
    assert value("oncely_tasks_total", task="charge", state="lease_lost") == 1
    assert value("oncely_tasks_total", task="refund", state="dead") == 1
    assert value("oncely_tasks_total", task="refund", state="discarded") == 1
    assert value("oncely_task_retries_total", task="charge") == 1
    assert value("oncely_task_duration_seconds_count", task="charge", state="succeeded") == 1
    assert value("oncely_task_duration_seconds_sum", task="charge", state="succeeded") == 0.03
    assert value("oncely_duplicates_suppressed_total", job="charge", kind="task") == 1
    assert value("oncely_duplicates_suppressed_total", job="send_email", kind="effect") == 1
    assert value("oncely_effects_total", effect="send_email", status="ran") == 1
    assert value("oncely_effects_total", effect="send_email", status="skipped") == 1


def test_the_event_table_only_names_declared_metrics() -> None:
    used = {update.metric for updates in metrics.EVENTS.values() for update in updates}
    assert used == set(metrics.METRICS)
    for updates in metrics.EVENTS.values():
        for update in updates:
            kind = metrics.METRICS[update.metric][0]
            assert (update.observe_ms is not None) == (kind == "histogram"), update


def test_serve_reports_a_port_in_use(registry: CollectorRegistry) -> None:
    first = metrics.serve(0, registry=registry)
    try:
        with pytest.raises(ConfigError, match=f"127.0.0.1:{first.port}"):
            metrics.serve(first.port, registry=registry)
    finally:
        first.close()
