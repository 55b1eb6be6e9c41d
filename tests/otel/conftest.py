"""An OpenTelemetry SDK tracer provider for one test, its spans kept in memory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from otel_helpers import Spans, reset_globals  # type: ignore[import-not-found]


@pytest.fixture
def spans() -> Iterator[Spans]:
    """A configured SDK provider (the global one) for the test; reset afterwards."""
    found = Spans()
    found.start()
    try:
        yield found
    finally:
        reset_globals()
        found.provider.shutdown()
