"""A trace across processes: this test's request enqueues a task, `oncely worker` (a real
process, its SDK exporting to a file) runs it twice (attempt 1 fails, attempt 2 succeeds),
all in the request's trace; the worker's slot attempts and `oncely run`'s duplicate have
their spans too. On SQLite and Postgres."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from otel_helpers import Spans  # type: ignore[import-not-found]
from sqlalchemy.ext.asyncio import AsyncSession
from tests.apps import traced
from tests.support import ROOT, run_cli, start_cli, wait_until

from oncely import Oncely

APP = "tests.apps.traced:app"


def exported(directory: Path) -> list[dict[str, Any]]:
    """Every span the app's processes exported (complete lines only)."""
    found = []
    for path in sorted(directory.glob("spans-*.jsonl")):
        for line in path.read_text().splitlines(keepends=True):
            if line.endswith("\n"):
                found.append(json.loads(line))
    return found


@pytest.fixture
def env(db_url: str, sync_engine: sa.Engine, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "spans").mkdir()
    env = {
        "ONCELY_DATABASE_URL": db_url,
        "ONCELY_APP": APP,
        "ONCELY_TEST_SIGNALS": str(tmp_path),
        "ONCELY_TEST_SPANS": str(tmp_path / "spans"),
    }
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    with sync_engine.begin() as conn:
        for ddl in traced.TABLES:
            conn.exec_driver_sql(ddl)
    return env


async def test_a_request_enqueue_and_both_attempts_are_one_trace(
    env: dict[str, str], db_url: str, sync_engine: sa.Engine, spans: Spans, tmp_path: Path
) -> None:
    app = Oncely(db_url)
    with spans.tracer.start_as_current_span("POST /orders/7/charge") as request:
        async with AsyncSession(app.store.engine) as db, db.begin():
            rec = await traced.charge.enqueue(db, order_id=7, idempotency_key="charge:7")
        async with AsyncSession(app.store.engine) as db, db.begin():
            again = await traced.charge.enqueue(db, order_id=7, idempotency_key="charge:7")
    await app.aclose()
    assert again.duplicate and again.id == rec.id
    directory = tmp_path / "spans"

    def task_spans() -> list[dict[str, Any]]:
        return [s for s in exported(directory) if s["name"] == "oncely.task"]

    def job_spans() -> list[dict[str, Any]]:
        return [s for s in exported(directory) if s["name"] == "oncely.job"]

    worker = start_cli("worker", "--concurrency", "2", env=env)
    try:
        wait_until(lambda: len(task_spans()) >= 2, "both attempts' spans")
        wait_until(
            lambda: any(s["attributes"]["oncely.outcome"] == "ran" for s in job_spans()),
            "a slot attempt's span",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    with sync_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT n FROM effects")).scalars().all() == [7]

    # In this process: the request, then its enqueue (and the duplicate's, with its event).
    trace_id = f"{request.get_span_context().trace_id:032x}"
    enqueue, duplicate = spans.named("oncely.enqueue")
    assert enqueue.parent.span_id == request.get_span_context().span_id
    assert [e.name for e in duplicate.events] == ["duplicate suppressed"]
    enqueue_id = f"{enqueue.context.span_id:016x}"

    # In the worker's process: attempt 1 failed (retry scheduled), attempt 2 succeeded, both
    # children of the enqueue, in the request's trace.
    attempts = sorted(task_spans(), key=lambda s: s["attributes"]["oncely.attempt"])
    assert len(attempts) == 2
    assert {s["pid"] for s in attempts} == {worker.pid} != {os.getpid()}
    for span in attempts:
        assert (span["trace_id"], span["parent_span_id"]) == (trace_id, enqueue_id)
        assert span["kind"] == "CONSUMER"
        assert span["attributes"]["oncely.task"] == "charge"
        assert span["attributes"]["oncely.task_id"] == rec.id
        assert span["attributes"]["oncely.queue"] == "default"
    failed, ok = attempts
    assert (failed["attributes"]["oncely.attempt"], ok["attributes"]["oncely.attempt"]) == (1, 2)
    assert (failed["status"], failed["attributes"]["oncely.outcome"]) == ("ERROR", "retried")
    assert [e["name"] for e in failed["events"]] == ["exception", "retry scheduled"]
    assert failed["events"][0]["attributes"]["exception.type"].endswith("GatewayTimeout")
    assert (ok["status"], ok["attributes"]["oncely.outcome"]) == ("UNSET", "succeeded")

    # The worker's slot attempts: one span each, with the job, its key and its slot.
    ran = [s for s in job_spans() if s["attributes"]["oncely.outcome"] == "ran"]
    for span in ran:
        attributes = span["attributes"]
        assert attributes["oncely.job"] == "tick" and span["pid"] == worker.pid
        assert attributes["oncely.key"] and attributes["oncely.slot"]
        assert span["parent_span_id"] is None  # the loop has no trace of its own


async def test_oncely_run_twice_the_duplicate_is_a_span_event(
    env: dict[str, str], tmp_path: Path
) -> None:
    at = "2026-11-27T18:00:00+00:00"
    for _ in range(2):
        done = run_cli("run", "tick", "--now", at, cwd=ROOT, env=env)
        assert done.returncode == 0, done.stderr
    first, again = [s for s in exported(tmp_path / "spans") if s["name"] == "oncely.job"]
    assert first["pid"] != again["pid"]  # two processes
    assert (first["attributes"]["oncely.outcome"], again["attributes"]["oncely.outcome"]) == (
        "ran",
        "skipped",
    )
    assert first["attributes"]["oncely.slot"] == again["attributes"]["oncely.slot"] == at
    assert first["attributes"]["oncely.key"] == again["attributes"]["oncely.key"]
    (event,) = again["events"]
    assert event["name"] == "duplicate suppressed"
    assert event["attributes"]["oncely.event"] == "run.skipped"
