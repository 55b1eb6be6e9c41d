"""The `django.tasks` backend: enqueue on Django's transaction; `run_attempt` (a task's work and
its ack in one `atomic()`), on SQLite and Postgres task rows."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from shop_helpers import count

from oncely import events
from oncely.store import dialect_for
from oncely.store import task_queue_sql as tasks_sql


def test_a_task_enqueued_in_a_rolled_back_block_does_not_exist(alias: str) -> None:
    from django.db import transaction
    from shop.tasks import send_receipt

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic(using=alias):
        send_receipt.using(backend=alias).enqueue(1)
        assert count(alias, "oncely_tasks") >= 1  # inside the block, the row is there ...
        raise Boom
    assert count(alias, "oncely_tasks") == 0  # ... and went with the rollback


def test_a_task_enqueued_in_a_committed_block_is_one_row(alias: str) -> None:
    from django.db import transaction
    from shop.tasks import mail_receipt

    later = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
    with transaction.atomic(using=alias):
        result = _enqueue(alias, mail_receipt.using(run_after=later), 5)
    rows = _rows(alias)
    assert len(rows) == 1
    row = rows[0]
    assert row.task == "shop.tasks.mail_receipt" and row.queue == "mail"
    assert row.args == {"args": [5], "kwargs": {}} and row.state == "available"
    assert row.run_at == later
    assert result.id == str(row.id) and result.status.name == "READY"
    fetched = _backend(alias).get_result(result.id)
    assert fetched.status.name == "READY" and fetched.args == [5]


def test_a_priority_is_the_row_s_and_an_idempotency_key_enqueues_once(alias: str) -> None:
    from shop.tasks import send_receipt

    from oncely.contrib.django import enqueue

    backend = _backend(alias)
    assert backend.supports_priority
    high = backend.enqueue(send_receipt.using(priority=100), [1], {})
    low = backend.enqueue(send_receipt.using(priority=-100), [2], {})
    assert [(r.id, r.priority) for r in _rows(alias)] == [(int(high.id), 100), (int(low.id), -100)]
    assert backend.get_result(high.id).task.priority == 100  # read back from the row
    with pytest.raises(Exception, match="priority"):  # Django's range, checked by Django
        send_receipt.using(priority=101)
    seen: list[tuple[str, dict[str, Any]]] = []

    def observer(event: str, fields: dict[str, Any]) -> None:
        seen.append((event, fields))

    first = enqueue(send_receipt.using(backend=alias), 9, idempotency_key="receipt:9")
    events.subscribe(observer)
    try:
        again = enqueue(send_receipt.using(backend=alias), 9, idempotency_key="receipt:9")
    finally:
        events.unsubscribe(observer)
    assert first.id == again.id
    (duplicate,) = [fields for event, fields in seen if event == "task.duplicate"]
    assert duplicate["idempotency_key"] == "receipt:9" and duplicate["id"] == int(first.id)
    assert count(alias, "oncely_tasks") == 3
    other = enqueue(send_receipt.using(backend=alias), 9, idempotency_key="receipt:9b")
    assert other.id != first.id  # another key, another task


def _lease(alias: str, token: str) -> int:
    from oncely.contrib.django.models import TaskRow

    (row,) = _rows(alias)
    TaskRow.objects.using(alias).filter(id=row.id).update(state="running", lease_token=token)
    return int(row.id)


def _ack(alias: str, task_id: int, token: str) -> tuple[Any, dict[str, Any]]:
    """oncely's ack compare-and-set and its parameters, as the worker builds them."""
    from django.db import connections

    dialect = dialect_for(connections[alias].vendor)
    return tasks_sql.ack(dialect.now_sql()), {
        "p_ids": [task_id],
        "p_token": token,
        **dialect.now_params(),
    }


def test_run_attempt_commits_the_work_with_the_ack(alias: str) -> None:
    from shop.tasks import send_receipt

    from oncely.contrib.django import run_attempt

    _enqueue(alias, send_receipt, 7)
    task_id = _lease(alias, "tok-1")
    sql, params = _ack(alias, task_id, "tok-1")
    value = run_attempt(alias, "shop.tasks.send_receipt", [7], {"using": alias}, sql, params)
    assert value == 7
    assert count(alias, "shop_receipt", "WHERE order_id = 7") == 1
    assert _rows(alias)[0].state == "succeeded"


def test_run_attempt_rolls_the_work_back_when_the_ack_matches_no_row(alias: str) -> None:
    from shop.tasks import send_receipt

    from oncely.contrib.django import LeaseLostError, run_attempt

    _enqueue(alias, send_receipt, 8)
    task_id = _lease(alias, "tok-new")  # another worker took the lease over
    sql, params = _ack(alias, task_id, "tok-old")
    with pytest.raises(LeaseLostError, match="lease was lost"):
        run_attempt(alias, "shop.tasks.send_receipt", [8], {"using": alias}, sql, params)
    assert count(alias, "shop_receipt") == 0  # the task's ORM work rolled back
    row = _rows(alias)[0]
    assert row.state == "running" and row.lease_token == "tok-new"  # untouched


def test_run_attempt_rolls_back_a_task_that_raises_without_its_ack(alias: str) -> None:
    from shop.tasks import send_receipt

    from oncely.contrib.django import run_attempt

    _enqueue(alias, send_receipt, 3)
    task_id = _lease(alias, "tok")
    sql, params = _ack(alias, task_id, "tok")
    with pytest.raises(TypeError):
        run_attempt(alias, "shop.tasks.send_receipt", [3, 4, 5], {"using": alias}, sql, params)
    assert count(alias, "shop_receipt") == 0
    assert _rows(alias)[0].state == "running"


def _backend(alias: str) -> Any:
    from oncely.contrib.django import TaskBackend

    return TaskBackend(alias, {"QUEUES": ["default", "mail"], "OPTIONS": {"DATABASE": alias}})


def _enqueue(alias: str, task: Any, *args: Any) -> Any:
    return task.using(backend=alias).enqueue(*args)


def _rows(alias: str) -> list[Any]:
    from oncely.contrib.django.models import TaskRow

    return list(TaskRow.objects.using(alias).order_by("id"))


def test_get_result_maps_a_dead_task_to_failed_with_its_last_error(alias: str) -> None:
    from shop.tasks import send_receipt

    from oncely.contrib.django.models import TaskRow

    result = _enqueue(alias, send_receipt, 4)
    TaskRow.objects.using(alias).filter(id=int(result.id)).update(
        state="dead", error="shop.errors.GatewayTimeout: 504\nTraceback ..."
    )
    failed = _backend(alias).get_result(result.id)
    assert failed.status.name == "FAILED"
    assert [e.exception_class_path for e in failed.errors] == ["shop.errors.GatewayTimeout"]
    assert "504" in failed.errors[0].traceback


def test_an_enqueue_carries_the_callers_trace_context(alias: str) -> None:
    """With a tracer provider configured, the row stores the `oncely.enqueue` span's context
    (a child of the caller's span), so that the worker's attempts continue the trace."""
    import json

    from django.db import connections
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.util._once import Once
    from shop.tasks import send_receipt

    def reset() -> None:  # the global provider is set-once: as OpenTelemetry's tests reset it
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reset()
    trace.set_tracer_provider(provider)
    try:
        with provider.get_tracer("tests").start_as_current_span("request") as request:
            result = _enqueue(alias, send_receipt, 3)
    finally:
        reset()
        provider.shutdown()
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "oncely.enqueue"]
    assert span.parent is not None and span.parent.span_id == request.get_span_context().span_id
    assert span.attributes["oncely.task"] == "shop.tasks.send_receipt"
    assert span.attributes["oncely.task_id"] == int(result.id)
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT trace_context FROM oncely_tasks")
        ((stored,),) = cursor.fetchall()
    _, trace_id, span_id, _ = json.loads(stored)["traceparent"].split("-")
    assert (trace_id, span_id) == (f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}")
