"""Prometheus metrics, built only from oncely's events (`oncely.events.subscribe`).

Nothing else in oncely knows metrics exist: every number here comes from the same event that
writes the log line, so a counter and a log line never disagree. Install with the extra
the `metrics` extra (prometheus-client: `pip install prometheus-client`), then either

    oncely.metrics.install()          # into prometheus_client's default registry, or
    oncely.metrics.serve(9464)        # install and serve /metrics on 127.0.0.1:9464

`EVENTS` below is the whole mapping from events to metrics; docs/events.md renders it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import events
from .errors import ConfigError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

# Seconds; run durations from milliseconds to ten minutes, fire latency up to an hour.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600)

# name -> (kind, help, label names, buckets)
METRICS: dict[str, tuple[str, str, tuple[str, ...], tuple[float, ...]]] = {
    "oncely_runs_total": (
        "counter",
        "Attempts at scheduled slots, by job and outcome (ran, skipped, busy, failed).",
        ("job", "status"),
        (),
    ),
    "oncely_duplicates_suppressed_total": (
        "counter",
        "Duplicates that had no effect: a slot already claimed, a task enqueued again with "
        "its idempotency key, a once-handler already applied.",
        ("job", "kind"),
        (),
    ),
    "oncely_slots_missed_total": (
        "counter",
        "Slots that were due while no worker ran and were not caught up (misfire policy).",
        ("job",),
        (),
    ),
    "oncely_slots_overlap_skipped_total": (
        "counter",
        "Slots skipped because the job's previous slot was still running (overlap policy).",
        ("job",),
        (),
    ),
    "oncely_tasks_total": (
        "counter",
        "Queue task transitions, by task and the state entered.",
        ("task", "state"),
        (),
    ),
    "oncely_task_retries_total": (
        "counter",
        "Task attempts that failed and were scheduled again by the retry policy.",
        ("task",),
        (),
    ),
    "oncely_effects_total": (
        "counter",
        "Once-handler calls, by effect and outcome (ran, skipped).",
        ("effect", "status"),
        (),
    ),
    "oncely_run_duration_seconds": (
        "histogram",
        "Time from a slot's claim to its commit or rollback, for runs that called the job.",
        ("job", "status"),
        DURATION_BUCKETS,
    ),
    "oncely_fire_latency_seconds": (
        "histogram",
        "How late a slot's winning attempt started: its start minus the slot's nominal time.",
        ("job",),
        LATENCY_BUCKETS,
    ),
    "oncely_task_duration_seconds": (
        "histogram",
        "Time a task attempt took, for attempts that finished (succeeded or not).",
        ("task", "state"),
        DURATION_BUCKETS,
    ),
}


@dataclass(frozen=True)
class Update:
    """One metric change an event causes: `inc` a counter, or `observe` a field in seconds."""

    metric: str
    labels: Callable[[Mapping[str, Any]], tuple[str, ...]]
    observe_ms: str | None = None
    """For histograms: the event field, in milliseconds, whose value is observed."""
    count: str | None = None
    """For counters: the event field holding how many to add (default 1)."""


def _name(fields: Mapping[str, Any], *keys: str) -> str:
    for key in keys:
        value = fields.get(key)
        if value is not None:
            return str(value)
    return "unknown"


def _job(fields: Mapping[str, Any]) -> str:
    return _name(fields, "job")


def _task(fields: Mapping[str, Any]) -> str:
    return _name(fields, "task", "name", "job")


def _effect(fields: Mapping[str, Any]) -> str:
    return _name(fields, "effect", "name", "job", "task")


def _const(*values: str) -> Callable[[Mapping[str, Any]], tuple[str, ...]]:
    return lambda _fields: values


def _run(status: str) -> list[Update]:
    return [Update("oncely_runs_total", lambda f: (_job(f), status))]


def _task_state(state: str) -> list[Update]:
    return [Update("oncely_tasks_total", lambda f: (_task(f), state))]


def _task_done(state: str) -> list[Update]:
    return [
        *_task_state(state),
        Update("oncely_task_duration_seconds", lambda f: (_task(f), state), "duration_ms"),
    ]


# The one table: which event moves which metric (and with which labels).
EVENTS: dict[str, list[Update]] = {
    "run.ran": [
        *_run("ran"),
        Update("oncely_run_duration_seconds", lambda f: (_job(f), "ran"), "duration_ms"),
        Update("oncely_fire_latency_seconds", lambda f: (_job(f),), "latency_ms"),
    ],
    "run.skipped": [
        *_run("skipped"),
        Update("oncely_duplicates_suppressed_total", lambda f: (_job(f), "slot")),
    ],
    "run.busy": _run("busy"),
    "run.failed": [
        *_run("failed"),
        Update("oncely_run_duration_seconds", lambda f: (_job(f), "failed"), "duration_ms"),
    ],
    "run.timeout": [
        *_run("timeout"),
        Update("oncely_run_duration_seconds", lambda f: (_job(f), "timeout"), "duration_ms"),
    ],
    "run.cancelled": _run("cancelled"),
    # A slot an earlier attempt gave up, or whose retry is not due yet: not started.
    "run.given_up": _run("given_up"),
    "run.retry_wait": _run("retry_wait"),
    "run.paused": [  # the worker reports a range of paused slots at once (`count`)
        Update("oncely_runs_total", lambda f: (_job(f), "paused"), count="count")
    ],
    "run.missed": [Update("oncely_slots_missed_total", lambda f: (_job(f),), count="count")],
    "run.overlap_skipped": [Update("oncely_slots_overlap_skipped_total", lambda f: (_job(f),))],
    "task.enqueued": _task_state("enqueued"),
    "task.duplicate": [
        *_task_state("duplicate"),
        Update("oncely_duplicates_suppressed_total", lambda f: (_task(f), "task")),
    ],
    "task.started": _task_state("started"),
    "task.succeeded": _task_done("succeeded"),
    "task.retry": [
        *_task_done("retry"),
        Update("oncely_task_retries_total", lambda f: (_task(f),)),
    ],
    "task.discarded": _task_done("discarded"),
    "task.dead": _task_done("dead"),
    "task.lease_lost": _task_state("lease_lost"),
    "effect.ran": [Update("oncely_effects_total", lambda f: (_effect(f), "ran"))],
    "effect.skipped": [
        Update("oncely_effects_total", lambda f: (_effect(f), "skipped")),
        Update("oncely_duplicates_suppressed_total", lambda f: (_effect(f), "effect")),
    ],
}


class Metrics:
    """oncely's metrics in one Prometheus registry, fed by an events observer."""

    def __init__(self, registry: CollectorRegistry) -> None:
        prometheus = _prometheus()
        self.registry = registry
        self._metrics: dict[str, Any] = {}
        for name, (kind, doc, labels, buckets) in METRICS.items():
            if kind == "counter":
                # prometheus_client adds the `_total` suffix itself.
                metric: Any = prometheus.Counter(
                    name.removesuffix("_total"), doc, labels, registry=registry
                )
            else:
                metric = prometheus.Histogram(name, doc, labels, buckets=buckets, registry=registry)
            self._metrics[name] = metric

    def observe(self, event: str, fields: Mapping[str, Any]) -> None:
        """Apply one event to the metrics (the events observer); unknown events are ignored."""
        for update in EVENTS.get(event, ()):
            metric = self._metrics[update.metric].labels(*update.labels(fields))
            if update.observe_ms is None:
                amount = fields.get(update.count, 1) if update.count else 1
                metric.inc(amount if isinstance(amount, (int, float)) and amount > 0 else 1)
                continue
            value = fields.get(update.observe_ms)
            if isinstance(value, (int, float)):
                metric.observe(max(0.0, float(value) / 1000.0))


_installed: dict[int, Metrics] = {}
_lock = threading.Lock()


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "oncely's metrics need prometheus-client: pip install prometheus-client "
            "(what oncely's `metrics` extra installs)"
        ) from exc
    return prometheus_client


def install(registry: CollectorRegistry | None = None) -> Metrics:
    """Register oncely's metrics in `registry` (default: prometheus_client's) and feed them.

    Idempotent per registry: calling it again returns the same Metrics.
    """
    target = registry if registry is not None else _prometheus().REGISTRY
    with _lock:
        metrics = _installed.get(id(target))
        if metrics is None:
            metrics = Metrics(target)
            _installed[id(target)] = metrics
            events.subscribe(metrics.observe)
    return metrics


def uninstall(registry: CollectorRegistry | None = None) -> None:
    """Stop feeding oncely's metrics and remove them from `registry` (e.g. between tests)."""
    target = registry if registry is not None else _prometheus().REGISTRY
    with _lock:
        metrics = _installed.pop(id(target), None)
    if metrics is not None:
        events.unsubscribe(metrics.observe)
        for metric in metrics._metrics.values():
            target.unregister(metric)


@dataclass
class Server:
    """A running /metrics endpoint; `close()` stops it."""

    host: str
    port: int
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        """Where to scrape, e.g. http://127.0.0.1:9464/metrics."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(port: int, host: str = "127.0.0.1", registry: CollectorRegistry | None = None) -> Server:
    """Install the metrics and serve them at http://HOST:PORT/metrics from a daemon thread.

    The default host is loopback: exposing metrics beyond the machine is a choice to make
    explicitly (e.g. `host="0.0.0.0"` inside a container). Port 0 picks a free port.
    """
    prometheus = _prometheus()
    target = registry if registry is not None else prometheus.REGISTRY
    install(target)
    try:
        server, thread = prometheus.start_http_server(port, addr=host, registry=target)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
    return Server(host, int(server.server_port), server, thread)
