"""A traced app, for tests that read oncely's spans from real worker and CLI processes.

With $ONCELY_TEST_SPANS (a directory) set, it configures the OpenTelemetry SDK's tracer
provider at import, as an application would at startup, exporting every span as one JSON
line to `<dir>/spans-<pid>.jsonl` as soon as the span ends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from oncely import Oncely, RetryPolicy, every

app = Oncely()

SIGNAL_DIR = Path(os.environ.get("ONCELY_TEST_SIGNALS", "."))
TABLES = (
    "CREATE TABLE ticks (slot varchar(40) NOT NULL)",
    "CREATE TABLE effects (n integer NOT NULL)",
)


class GatewayTimeout(Exception):
    """A failure worth retrying."""


@app.task(retry=RetryPolicy(attempts=3, wait=0.05, backoff="fixed", retry_on=[GatewayTimeout]))
async def charge(db, order_id: int) -> None:  # type: ignore[no-untyped-def]
    """Fails its first attempt (a file says it did), writes its effect on the next."""
    failed = SIGNAL_DIR / f"failed-{order_id}"
    if not failed.exists():
        failed.touch()
        raise GatewayTimeout(f"the gateway timed out charging {order_id}")
    await db.execute(sa.text("INSERT INTO effects (n) VALUES (:n)"), {"n": order_id})


@app.job(every(seconds=1), catch_up="none")
async def tick(db, now):  # type: ignore[no-untyped-def]
    await db.execute(sa.text("INSERT INTO ticks (slot) VALUES (:s)"), {"s": now.isoformat()})


def _configure(directory: Path) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class JsonLines(SpanExporter):
        """Each span as one JSON line, written and flushed when it ends."""

        def __init__(self, path: Path) -> None:
            self.file = path.open("a", encoding="utf-8")

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            for span in spans:
                self.file.write(json.dumps(_as_json(span)) + "\n")
            self.file.flush()
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            self.file.close()

    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(JsonLines(directory / f"spans-{os.getpid()}.jsonl"))
    )
    trace.set_tracer_provider(provider)


def _as_json(span: Any) -> dict[str, Any]:
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "kind": span.kind.name,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
        "pid": os.getpid(),
    }


if os.environ.get("ONCELY_TEST_SPANS"):
    _configure(Path(os.environ["ONCELY_TEST_SPANS"]))
