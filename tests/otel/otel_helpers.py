"""An OpenTelemetry SDK tracer provider as the global one, its spans kept in memory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def reset_globals() -> None:
    """No global provider, as in a fresh process."""
    # The global provider can be set once per process; OpenTelemetry's own tests reset it
    # the same way (opentelemetry.test.globals_test), so that one test's provider does not
    # trace the rest of the suite.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


class Spans:
    """The spans ended while the provider was set, and a tracer for the test's own."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def start(self) -> None:
        reset_globals()
        trace.set_tracer_provider(self.provider)

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        """No provider within the block (tracing off), the provider again after it."""
        reset_globals()
        try:
            yield
        finally:
            self.start()

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        yield
