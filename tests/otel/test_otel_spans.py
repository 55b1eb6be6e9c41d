"""oncely's spans, in this process, on SQLite and Postgres: a task's attempts continue the trace
of the code that enqueued it; slot attempts and the worker loop's decisions have spans; the
events that are span events land on them. Off (no provider, no API): nothing is stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.trace import SpanKind, StatusCode
from otel_helpers import Spans  # type: ignore[import-not-found]
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from tests.conftest import wire_messages
from tests.support import ROOT

from oncely import Oncely, RetryPolicy, events, every
from oncely.model import Pause
from oncely.queue import worker
from oncely.runner import paused


class Transient(Exception):
    """A failure worth retrying."""


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Oncely]:
    oncely = Oncely(db_url, lease=5)
    await oncely.migrate()
    try:
        yield oncely
    finally:
        await oncely.aclose()


def traces(engine: sa.Engine) -> dict[int, Any]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, trace_context FROM oncely_tasks ORDER BY id"))
        return {i: json.loads(t) if t is not None else None for i, t in rows}


def hexid(span_id: int) -> str:
    return f"{span_id:016x}"


async def test_a_tasks_attempts_continue_the_trace_of_its_enqueue(
    app: Oncely, spans: Spans, sync_engine: sa.Engine
) -> None:
    calls: list[int] = []

    @app.task(retry=RetryPolicy(attempts=3, wait=0, backoff="fixed", retry_on=[Transient]))
    async def charge(db: Any, order_id: int) -> None:
        calls.append(order_id)
        if len(calls) == 1:
            raise Transient("the gateway timed out")

    with spans.tracer.start_as_current_span("request") as request:
        async with AsyncSession(app.store.engine) as db, db.begin():
            rec = await charge.enqueue(db, order_id=42, idempotency_key="charge:42")
    runner = worker(app)
    first, second = await runner.step(), await runner.step()
    assert [type(o).__name__ for o in first + second] == ["Retried", "Succeeded"]

    (enqueue,) = spans.named("oncely.enqueue")
    trace_id = request.get_span_context().trace_id
    assert enqueue.parent is not None and enqueue.parent.span_id == request.context.span_id
    assert enqueue.context.trace_id == trace_id and enqueue.kind is SpanKind.PRODUCER
    assert dict(enqueue.attributes or {}) == {
        "oncely.task": "charge",
        "oncely.queue": "default",
        "oncely.count": 1,
        "oncely.key": "charge:42",
        "oncely.task_id": rec.id,
        "oncely.duplicate": False,
    }
    # The row carries the enqueue span's context (W3C traceparent), written by the INSERT.
    stored = traces(sync_engine)[rec.id]
    assert stored["traceparent"].split("-")[1:3] == [
        f"{trace_id:032x}",
        hexid(enqueue.context.span_id),
    ]

    attempts = sorted(spans.named("oncely.task"), key=lambda s: s.attributes["oncely.attempt"])
    assert [s.attributes["oncely.attempt"] for s in attempts] == [1, 2]
    for span in attempts:
        assert span.context.trace_id == trace_id and span.kind is SpanKind.CONSUMER
        assert span.parent is not None and span.parent.span_id == enqueue.context.span_id
        assert span.attributes["oncely.task"] == "charge"
        assert span.attributes["oncely.task_id"] == rec.id
        assert span.attributes["oncely.queue"] == "default"
    failed, ok = attempts
    assert failed.attributes["oncely.outcome"] == "retried"
    assert failed.status.status_code is StatusCode.ERROR
    assert "Transient: the gateway timed out" in (failed.status.description or "")
    names = [e.name for e in failed.events]
    assert names == ["exception", "retry scheduled"]
    retry = failed.events[1].attributes or {}
    assert (retry["oncely.event"], retry["oncely.id"], retry["oncely.wait"]) == (
        "task.retry",
        rec.id,
        0,
    )
    assert ok.attributes["oncely.outcome"] == "succeeded"
    assert ok.status.status_code is StatusCode.UNSET and list(ok.events) == []


async def test_a_duplicate_enqueue_says_so_on_its_span(app: Oncely, spans: Spans) -> None:
    @app.task
    async def charge(db: Any, order_id: int) -> None:
        pass

    for _ in range(2):
        async with AsyncSession(app.store.engine) as db, db.begin():
            rec = await charge.enqueue(db, order_id=1, idempotency_key="charge:1")
    first, again = spans.named("oncely.enqueue")
    assert (first.attributes["oncely.duplicate"], again.attributes["oncely.duplicate"]) == (
        False,
        True,
    )
    assert first.events == () and [e.name for e in again.events] == ["duplicate suppressed"]
    details = again.events[0].attributes or {}
    assert (details["oncely.idempotency_key"], details["oncely.id"]) == ("charge:1", rec.id)
    assert details["oncely.state"] == "available"


async def test_enqueue_many_and_enqueue_sync_carry_the_context(
    app: Oncely, spans: Spans, sync_engine: sa.Engine
) -> None:
    @app.task
    async def charge(db: Any, order_id: int) -> None:
        pass

    async with AsyncSession(app.store.engine) as db, db.begin():
        many = await charge.enqueue_many(db, [{"order_id": n} for n in range(3)])
    with Session(sync_engine) as session, session.begin():
        one = charge.enqueue_sync(session, order_id=9)
    committed = await charge.enqueue_committed(app.store, order_id=10)  # the CLI's way
    batch, sync, own = spans.named("oncely.enqueue")
    assert (batch.attributes["oncely.count"], batch.attributes["oncely.duplicates"]) == (3, 0)
    stored = traces(sync_engine)
    for recs, span in (many, batch), ([one], sync), ([committed], own):
        for rec in recs:
            assert stored[rec.id]["traceparent"].split("-")[2] == hexid(span.context.span_id)
    assert len({s.context.trace_id for s in (batch, sync, own)}) == 3  # no parent: new traces


async def test_a_lost_lease_ends_the_attempt_span_with_its_event(
    app: Oncely, spans: Spans, sync_engine: sa.Engine
) -> None:
    @app.task
    async def taken(db: Any, n: int) -> None:
        with sync_engine.begin() as conn:  # another worker takes the task over meanwhile
            conn.execute(sa.text("UPDATE oncely_tasks SET lease_token = 'theirs'"))

    await taken.enqueue_committed(app.store, n=1)
    (outcome,) = await worker(app).step()
    assert type(outcome).__name__ == "LeaseLost"
    (span,) = spans.named("oncely.task")
    assert span.attributes["oncely.outcome"] == "lease_lost"
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["lease lost"]


async def test_slot_attempts_have_job_spans_with_their_outcome(app: Oncely, spans: Spans) -> None:
    @app.job(every(hours=1))
    async def close(db: Any, now: datetime) -> None:
        pass

    @app.job(every(hours=1))
    async def broken(db: Any, now: datetime) -> None:
        raise RuntimeError("no ledger")

    at = datetime(2026, 11, 27, 18, 0, tzinfo=timezone.utc)
    with spans.tracer.start_as_current_span("request") as request:
        ran = await app.run("close", now=at)
        skipped = await app.run("close", now=at)
        failed = await app.attempt("broken", now=at)
    assert [r.status.value for r in (ran, skipped, failed)] == ["ran", "skipped", "failed"]
    first, again, broke = spans.named("oncely.job")
    for span in first, again, broke:
        assert span.parent is not None and span.parent.span_id == request.context.span_id
        assert span.attributes["oncely.slot"] == at.isoformat()
        assert span.attributes["oncely.key"] == ran.key
    assert first.attributes["oncely.job"] == "close"
    assert first.attributes["oncely.outcome"] == "ran" and first.events == ()
    assert again.attributes["oncely.outcome"] == "skipped"
    assert again.status.status_code is StatusCode.UNSET
    (duplicate,) = again.events
    assert duplicate.name == "duplicate suppressed"
    assert duplicate.attributes["oncely.event"] == "run.skipped"
    assert duplicate.attributes["oncely.claimed_by"] == ran.claimed_by
    assert broke.attributes["oncely.outcome"] == "failed"
    assert broke.status.status_code is StatusCode.ERROR
    assert "RuntimeError: no ledger" in (broke.status.description or "")


async def test_the_loops_decisions_are_spans_of_their_own(app: Oncely, spans: Spans) -> None:
    """Overlap skipped and paused, decided in the worker's loop outside any attempt."""

    @app.job(every(hours=1))
    async def close(db: Any, now: datetime) -> None:
        pass

    at = datetime(2026, 11, 27, 18, 0, tzinfo=timezone.utc)
    job = app.registry.job("close")
    key = job.key_for(at)
    pause = Pause(job="close", paused_at=at, paused_by="ops", reason="incident")
    fields = {"job": "close", "key": key, "slot": at.isoformat(), "replica": "r1"}
    paused(job, at, key, pause, fields)  # what the loop calls for a paused job's slot
    events.emit("run.overlap_skipped", "not starting", **fields, running=at.isoformat())
    on_pause, on_overlap = spans.named("oncely.job")
    for span, outcome, event in (
        (on_pause, "paused", "paused"),
        (
            on_overlap,
            "overlap",
            "overlap skipped",
        ),
    ):
        assert span.parent is None
        assert span.attributes["oncely.outcome"] == outcome
        assert (span.attributes["oncely.job"], span.attributes["oncely.key"]) == ("close", key)
        assert span.attributes["oncely.replica"] == "r1"
        assert [e.name for e in span.events] == [event]
    assert on_pause.events[0].attributes["oncely.paused_by"] == "ops"


async def test_no_provider_no_context_stored(app: Oncely, sync_engine: sa.Engine) -> None:
    @app.task
    async def charge(db: Any, order_id: int) -> None:
        pass

    async with AsyncSession(app.store.engine) as db, db.begin():
        await charge.enqueue(db, order_id=1)
        await charge.enqueue_many(db, [{"order_id": 2}, {"order_id": 3}])
    assert list(traces(sync_engine).values()) == [None, None, None]
    outcomes = await worker(app).step()
    assert [type(o).__name__ for o in outcomes] == ["Succeeded"] * 3


@pytest.mark.postgres
async def test_on_asyncpg_the_context_adds_no_round_trip(
    postgres_database: str, spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast paths (the session's driver connection, a bare asyncpg connection) send the
    context in their one INSERT: as many messages with tracing on as off."""
    from tests.conftest import _reset_postgres

    _reset_postgres(postgres_database)
    app = Oncely(postgres_database)
    await app.migrate()

    @app.task
    async def charge(db: Any, order_id: int) -> None:
        pass

    url = make_url(postgres_database).set(drivername="postgresql+asyncpg")
    engine = create_async_engine(url)
    sent: dict[str, int] = {}
    try:
        for traced in (False, True):
            with spans.off() if not traced else spans.on():
                async with AsyncSession(engine) as db, db.begin():
                    await charge.enqueue(db, order_id=0)  # the statements prepared once
                    await charge.enqueue_many(db, [{"order_id": 0}, {"order_id": 0}])
                    with wire_messages(monkeypatch) as wire:
                        await charge.enqueue(db, order_id=1)
                        await charge.enqueue_many(db, [{"order_id": 2}, {"order_id": 3}])
                    sent[f"session {traced}"] = len(wire)
                async with engine.connect() as conn:
                    raw = (await conn.get_raw_connection()).driver_connection
                    await charge.enqueue(raw, order_id=4)
                    with wire_messages(monkeypatch) as wire:
                        await charge.enqueue(raw, order_id=5)
                    sent[f"bare {traced}"] = len(wire)
    finally:
        await engine.dispose()
    with sa.create_engine(url.set(drivername="postgresql+psycopg2")).connect() as conn:
        rows = conn.execute(sa.text("SELECT trace_context FROM oncely_tasks ORDER BY id"))
        stored = [t is not None for (t,) in rows]
    await app.aclose()
    assert sent["session True"] == sent["session False"] > 0
    assert sent["bare True"] == sent["bare False"] > 0
    assert stored == [False] * 8 + [True] * 8
    assert len(spans.named("oncely.enqueue")) == 6


def test_without_the_api_nothing_is_imported_and_tasks_still_run(tmp_path: Any) -> None:
    """With OpenTelemetry missing (imports of it fail), oncely imports, enqueues and runs."""
    script = f"""
import asyncio, sys
sys.modules["opentelemetry"] = None  # as if not installed: every import of it fails
import oncely
from oncely.queue import worker
assert "opentelemetry.trace" not in sys.modules
app = oncely.Oncely("sqlite:///{tmp_path / "o.db"}")

@app.task
async def charge(db, order_id: int):
    pass

async def main():
    await app.migrate()
    await charge.enqueue_committed(app.store, order_id=1)
    (outcome,) = await worker(app).step()
    print(type(outcome).__name__)
    await app.aclose()

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "Succeeded"), done.stderr


def test_importing_oncely_does_not_import_opentelemetry() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys, oncely; print('opentelemetry' in sys.modules)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "False", done.stderr


async def test_a_tasks_own_spans_are_children_of_its_attempt(app: Oncely, spans: Spans) -> None:
    """The attempt's span is current while the task runs: in the event loop for an async
    task, in the worker's thread for a plain `def` one."""

    @app.task
    async def fetch(db: Any, n: int) -> None:
        with spans.tracer.start_as_current_span("GET /rates"):
            pass

    @app.task
    def render(db: Any, n: int) -> None:
        with spans.tracer.start_as_current_span("render pdf"):
            pass

    await fetch.enqueue_committed(app.store, n=1)
    await render.enqueue_committed(app.store, n=2)
    runner = worker(app)
    outcomes = await runner.step()
    await runner.close()
    assert [type(o).__name__ for o in outcomes] == ["Succeeded", "Succeeded"]
    attempts = {s.attributes["oncely.task"]: s for s in spans.named("oncely.task")}
    for inner, task in ("GET /rates", "fetch"), ("render pdf", "render"):
        (span,) = spans.named(inner)
        assert span.parent is not None and span.parent.span_id == attempts[task].context.span_id


FIRST_WORK = """
import asyncio, sys
import oncely
from oncely import every
from oncely.runner import run_slot
from oncely.store import TaskQueue
from oncely.work import jobs
assert "opentelemetry.trace" not in sys.modules
seen = []
lease = TaskQueue.fetch

async def fetch(self, *args, **kwargs):
    seen.append("opentelemetry.trace" in sys.modules)
    return await lease(self, *args, **kwargs)

async def slot(*args, **kwargs):
    seen.append("opentelemetry.trace" in sys.modules)
    return await run_slot(*args, **kwargs)

TaskQueue.fetch, jobs.run_slot = fetch, slot
app = oncely.Oncely(sys.argv[1])
ran = asyncio.Event()

@app.task
async def charge(db, order_id: int):
    ran.set()

@app.job(every(seconds=1), name="each_second")
async def each_second(db, now):
    ran.set()

async def main():
    await app.migrate()
    if sys.argv[2] == "enqueue":  # in a process of its own: an enqueue imports the API
        await charge.enqueue_committed(app.store, order_id=1)
        await app.aclose()
        return
    stopping = asyncio.Event()
    if sys.argv[2] == "tasks":
        worker = asyncio.create_task(app.consume(stopping))
    else:
        worker = asyncio.create_task(app.work(concurrency=0, stopping=stopping))
    await asyncio.wait_for(ran.wait(), 30)
    stopping.set()
    await worker
    await app.aclose()
    print(seen[0])

asyncio.run(main())
"""


@pytest.mark.parametrize("part", ["tasks", "jobs"])
def test_a_worker_imports_the_api_as_it_starts_not_in_its_first_attempt(
    tmp_path: Any, part: str
) -> None:
    """The API's import (10-20 ms) happens as the task worker or the job loop starts: not
    between a task's lease and its start, nor inside a slot's attempt."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    for step in ["enqueue", part] if part == "tasks" else [part]:
        done = subprocess.run(
            [sys.executable, "-c", FIRST_WORK, url, step],
            cwd=ROOT,
            env=os.environ,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
