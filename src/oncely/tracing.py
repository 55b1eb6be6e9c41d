"""OpenTelemetry traces: a task's attempts continue the trace of the code that enqueued it.

Spans are made only where the OpenTelemetry API is installed (the `otel` extra) and a tracer
provider is configured (`opentelemetry.trace.set_tracer_provider`, the SDK's): otherwise
every function here returns at once, after one attribute read, and no trace context is stored
with a task. The API is imported the first time it is needed, never at oncely's import.

Spans (docs/tracing.md lists them with their attributes and events):

- `oncely.enqueue` (PRODUCER): around an enqueue's INSERT, in the caller's context. Its
  context is what the task row stores (the propagator's headers as JSON: W3C `traceparent`
  and `tracestate` by default), in the same INSERT.
- `oncely.task` (CONSUMER): one per attempt, in the worker, a child of that stored context;
  it ends when the attempt's outcome is in the database.
- `oncely.job`: one per slot attempt (`run_slot`), in the caller's context; and one of no
  duration for each slot the worker's loop decides not to start (overlap skipped, paused).

Span events come from the event log (`events.emit`): the events in SPAN_EVENTS are added to
the span current where they are emitted (the attempt's, the enqueue's), so that the log, the
metrics and the trace say the same thing from one place.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import events

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span as Span
    from opentelemetry.trace import Tracer

NAME = "oncely"
"""The instrumentation scope of oncely's spans (and the prefix of their attributes)."""

SPAN_EVENTS: dict[str, str] = {
    "task.duplicate": "duplicate suppressed",
    "run.skipped": "duplicate suppressed",
    "effect.skipped": "duplicate suppressed",
    "task.lease_lost": "lease lost",
    "task.retry": "retry scheduled",
    "run.overlap_skipped": "overlap skipped",
    "run.paused": "paused",
}
"""Log events that are also span events: event name -> span event name."""

LOOP_OUTCOMES = {"run.overlap_skipped": "overlap", "run.paused": "paused"}
"""Events the worker's loop emits for a slot it does not start, outside any attempt: each
becomes an `oncely.job` span of its own (no duration), with this outcome."""

_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()

_otel: dict[str, ModuleType] | None = None
_looked = False
_provider: object = None
_tracer: Tracer | None = None


def _load() -> dict[str, ModuleType] | None:
    """The OpenTelemetry API's modules, imported once; None if it is not installed."""
    global _otel, _looked
    if not _looked:
        _looked = True
        try:
            from opentelemetry import context, propagate, trace
        except ImportError:
            return None
        trace.get_tracer_provider()  # sets the provider OTEL_PYTHON_TRACER_PROVIDER names
        _otel = {"trace": trace, "propagate": propagate, "context": context}
    return _otel


def tracer() -> Tracer | None:
    """oncely's tracer, or None: the API is not installed, or no provider is configured."""
    otel = _otel if _looked else _load()
    if otel is None:
        return None
    trace = otel["trace"]
    # The set-once global that `set_tracer_provider` sets: read as an attribute, because
    # `get_tracer_provider()` looks up an environment variable on every call while no
    # provider is set (4 us here, as much as the rest of an enqueue's Python).
    provider = getattr(trace, "_TRACER_PROVIDER", trace)
    if provider is trace:  # an API that keeps it elsewhere: ask (correct, slower)
        provider = trace.get_tracer_provider()
    if provider is None:
        return None
    return _tracer if provider is _provider else _cache(trace, provider)


def warm() -> None:
    """Import the API and find the tracer now: a worker calls it as it starts, so that its
    first task or slot does not pay the import (10-20 ms) between its lease and its start,
    or inside its attempt."""
    tracer()


def _cache(trace: ModuleType, provider: Any) -> Tracer | None:
    global _provider, _tracer
    found: Tracer | None = None
    if not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        found = provider.get_tracer(NAME, _version())
    _provider, _tracer = provider, found
    return found


def _version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version(NAME)
    except metadata.PackageNotFoundError:
        return None


def _value(value: Any) -> Any:
    """A field as a span attribute's value (str, bool, int or float)."""
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def attributes(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Fields as span attributes, in oncely's namespace (`job` -> `oncely.job`)."""
    return {f"{NAME}.{k}": _value(v) for k, v in fields.items() if v is not None}


# -- enqueue -----------------------------------------------------------------------------


def enqueuing(
    task: str, queue: str, entries: Sequence[dict[str, Any]]
) -> contextlib.AbstractContextManager[Span | None]:
    """Around an enqueue's INSERT: an `oncely.enqueue` span, current, whose context each
    entry carries (its `trace`) into the row; nothing at all when tracing is off."""
    found = tracer()
    if found is None:
        return _NULL
    return _enqueuing(found, task, queue, entries)


@contextlib.contextmanager
def _enqueuing(
    found: Tracer, task: str, queue: str, entries: Sequence[dict[str, Any]]
) -> Iterator[Span]:
    otel = _otel
    assert otel is not None
    fields: dict[str, Any] = {"task": task, "queue": queue, "count": len(entries)}
    if len(entries) == 1:
        fields["key"] = entries[0].get("idempotency_key")
    kind = otel["trace"].SpanKind.PRODUCER
    with found.start_as_current_span("oncely.enqueue", kind=kind, attributes=attributes(fields)):
        carrier: dict[str, str] = {}
        otel["propagate"].inject(carrier)
        text = json.dumps(carrier, separators=(",", ":")) if carrier else None
        for entry in entries:
            entry["trace"] = text
        yield otel["trace"].get_current_span()


def enqueued(span: Span | None, records: Sequence[Any]) -> None:
    """Name the tasks an enqueue created (or found: duplicates) on its span."""
    if span is None:
        return
    if len(records) == 1:
        (rec,) = records
        span.set_attributes(attributes({"task_id": rec.id, "duplicate": rec.duplicate}))
    else:
        span.set_attribute(f"{NAME}.duplicates", sum(1 for r in records if r.duplicate))


# -- attempts ----------------------------------------------------------------------------


def _parent(trace_context: str | None) -> Context | None:
    """The context a task was enqueued in (None: none stored, continue the current one)."""
    if not trace_context:
        return None
    otel = _otel
    assert otel is not None
    try:
        carrier = json.loads(trace_context)
    except ValueError:
        carrier = None
    if not isinstance(carrier, dict):
        return None
    context: Context = otel["propagate"].extract(carrier)
    return context


def task_attempt(
    task: str, task_id: int, attempt: int, queue: str, trace_context: str | None
) -> Span | None:
    """Start an attempt's `oncely.task` span (not current: see `current`), a child of the
    context the task was enqueued in; None when tracing is off."""
    found = tracer()
    if found is None:
        return None
    otel = _otel
    assert otel is not None
    fields = {"task": task, "task_id": task_id, "attempt": attempt, "queue": queue}
    return found.start_span(
        "oncely.task",
        context=_parent(trace_context),
        kind=otel["trace"].SpanKind.CONSUMER,
        attributes=attributes(fields),
    )


def current(span: Span | None) -> contextlib.AbstractContextManager[Any]:
    """Make `span` current within the block (the task's own spans become its children),
    without ending it; nothing for None."""
    if span is None:
        return _NULL
    otel = _otel
    assert otel is not None
    use: contextlib.AbstractContextManager[Any] = otel["trace"].use_span(
        span, record_exception=False, set_status_on_exception=False
    )
    return use


def ended(
    span: Span | None, outcome: str, error: BaseException | str | None
) -> contextlib.AbstractContextManager[Any]:
    """Record an attempt's outcome on its span, keep the span current within the block (for
    the outcome's event) and end it on leaving; nothing for None."""
    if span is None:
        return _NULL
    finish(span, outcome, error)
    otel = _otel
    assert otel is not None
    use: contextlib.AbstractContextManager[Any] = otel["trace"].use_span(span, end_on_exit=True)
    return use


def finish(span: Span | None, outcome: str, error: BaseException | str | None) -> None:
    """Set `oncely.outcome`; an error (an exception, or a reason) marks the span failed."""
    if span is None:
        return
    span.set_attribute(f"{NAME}.outcome", outcome)
    if error is None:
        return
    otel = _otel
    assert otel is not None
    if isinstance(error, BaseException):
        span.record_exception(error)
        error = f"{type(error).__name__}: {error}"
    span.set_status(otel["trace"].Status(otel["trace"].StatusCode.ERROR, error))


def slot_attempt(
    job: str, key: str, slot: datetime, replica: str
) -> contextlib.AbstractContextManager[Span | None]:
    """Around one slot attempt: an `oncely.job` span, current, in the caller's context."""
    found = tracer()
    if found is None:
        return _NULL
    fields = {"job": job, "key": key, "slot": slot, "replica": replica}
    span: contextlib.AbstractContextManager[Span] = found.start_as_current_span(
        "oncely.job", attributes=attributes(fields)
    )
    return span


# -- span events -------------------------------------------------------------------------


def _on_event(event: str, fields: Mapping[str, Any]) -> None:
    """The events observer: SPAN_EVENTS on the current span (a loop's decision: its span)."""
    name = SPAN_EVENTS.get(event)
    if name is None:
        return
    found = tracer()
    if found is None:
        return
    otel = _otel
    assert otel is not None
    details = attributes({"event": event, **fields})
    span: Span = otel["trace"].get_current_span()
    if span.is_recording():
        span.add_event(name, details)
        return
    outcome = LOOP_OUTCOMES.get(event)
    if outcome is None:
        return
    keys = ("job", "key", "slot", "replica")
    slot = found.start_span(
        "oncely.job", attributes=attributes({k: fields.get(k) for k in keys} | {"outcome": outcome})
    )
    slot.add_event(name, details)
    slot.end()


events.subscribe(_on_event, SPAN_EVENTS)
