"""What `manage.py oncely worker` leaves for Django's API: results (`get_result`: status,
return value, errors, attempts, times), priorities (a higher one runs first), `takes_context`
tasks (their TaskContext) and the backend's timeouts; on SQLite and Postgres, in real
processes."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from shop_helpers import count
from test_django_task_worker import _rows, _states, _stop, _until, _worker, stopped

__all__ = ["stopped"]  # the fixture, for these tests


def test_get_result_maps_a_success_a_failure_and_a_pending_task(
    alias: str,
    django_project: dict[str, str],
    stopped: list[subprocess.Popen[str]],
    tmp_path: Path,
) -> None:
    from shop.tasks import flaky_receipt, mail_receipt, send_receipt

    from oncely.contrib.django import enqueue

    sent = enqueue(send_receipt.using(backend=alias), 11, using=alias, idempotency_key="r:11")
    failed = flaky_receipt.using(backend=alias).enqueue(
        12, str(tmp_path / "always"), using=alias, fail=99
    )
    later = datetime.now(timezone.utc) + timedelta(days=1)
    pending = mail_receipt.using(backend=alias, run_after=later).enqueue(13)
    worker = _worker(django_project, alias, "--concurrency", "2")
    stopped.append(worker)
    _until(
        lambda: _states(alias, "succeeded") + _states(alias, "dead") == 2,
        worker,
        "the two due tasks' ends",
    )
    _stop(worker)

    sent.refresh()  # Django's API: the backend's get_result, read from the row
    assert sent.status.name == "SUCCESSFUL" and sent.is_finished
    assert sent.return_value == 11  # what the task returned, stored with its ack
    assert sent.attempts == 1 and sent.worker_ids[0] and sent.errors == []
    assert sent.started_at is not None and sent.finished_at is not None
    assert sent.enqueued_at is not None and sent.enqueued_at <= sent.started_at
    assert sent.started_at <= sent.finished_at
    assert send_receipt.using(backend=alias).get_result(sent.id).return_value == 11
    # Enqueued again with its key after it ran: the same task, already done, not run again.
    again = enqueue(send_receipt.using(backend=alias), 11, using=alias, idempotency_key="r:11")
    assert again.id == sent.id and again.status.name == "SUCCESSFUL"
    assert count(alias, "shop_receipt", "WHERE order_id = 11") == 1

    result = flaky_receipt.using(backend=alias).get_result(failed.id)
    assert result.status.name == "FAILED" and result.attempts == 3  # its policy: 3 attempts
    # Every attempt's error, oldest first, as oncely kept them (oncely_task_errors).
    assert len(result.errors) == 3, result.errors
    assert all(e.exception_class is RuntimeError for e in result.errors)
    error = result.errors[-1]
    assert "Traceback (most recent call last)" in error.traceback
    assert "the payment gateway timed out" in error.traceback
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018  (Django raises for a failed task)

    waiting = mail_receipt.using(backend=alias).get_result(pending.id)
    assert waiting.status.name == "READY" and not waiting.is_finished
    assert waiting.attempts == 0 and waiting.started_at is None and waiting.errors == []
    assert waiting.task.run_after == later and waiting.task.queue_name == "mail"
    with pytest.raises(ValueError, match="not finished"):
        waiting.return_value  # noqa: B018
    assert count(alias, "shop_receipt", "WHERE order_id = 13") == 0


def test_a_task_s_retry_policy_discards_what_it_says_at_once(
    alias: str, django_project: dict[str, str], stopped: list[subprocess.Popen[str]]
) -> None:
    from shop.tasks import declined_receipt

    declined = declined_receipt.using(backend=alias).enqueue(41, using=alias)
    worker = _worker(django_project, alias)
    stopped.append(worker)
    _until(lambda: _states(alias, "discarded") == 1, worker, "the task's discard")
    _stop(worker)
    (row,) = _rows(alias)
    assert row.attempt == 1  # discard_on=[LookupError]: no retry of its 5 attempts
    assert count(alias, "shop_receipt") == 0  # its work rolled back
    result = declined_receipt.using(backend=alias).get_result(declined.id)
    assert result.status.name == "FAILED" and result.errors[0].exception_class is KeyError


def test_a_higher_priority_task_is_leased_first(
    alias: str, django_project: dict[str, str], stopped: list[subprocess.Popen[str]]
) -> None:
    from django.db import transaction
    from shop.tasks import send_receipt

    task = send_receipt.using(backend=alias)
    with transaction.atomic(using=alias):  # all due at once, the lowest first in the table
        for order_id, priority in [(1, -50), (2, 0), (3, 100), (4, 10), (5, -100)]:
            task.using(priority=priority).enqueue(order_id, using=alias)
    worker = _worker(django_project, alias, "--concurrency", "1")
    stopped.append(worker)
    _until(lambda: _states(alias, "succeeded") == 5, worker, "the 5 tasks' runs")
    _stop(worker)
    from shop.models import Receipt

    ran = list(Receipt.objects.using(alias).order_by("id").values_list("order_id", flat=True))
    assert ran == [3, 4, 2, 1, 5]  # by priority, highest first (the receipts' commit order)


def test_a_task_that_takes_context_is_handed_its_attempt_and_result(
    alias: str,
    django_project: dict[str, str],
    stopped: list[subprocess.Popen[str]],
    tmp_path: Path,
) -> None:
    from shop.tasks import numbered_receipt

    marker = tmp_path / "attempts"
    enqueued = numbered_receipt.using(backend=alias).enqueue(21, str(marker), using=alias)
    worker = _worker(django_project, alias)
    stopped.append(worker)
    _until(lambda: _states(alias, "succeeded") == 1, worker, "the task's success")
    _stop(worker)
    # Attempt 1 raised (rolled back), attempt 2 returned: each saw its number and its row.
    lines = marker.read_text().splitlines()
    assert lines == [f"1 {enqueued.id} RUNNING", f"2 {enqueued.id} RUNNING"]
    result = numbered_receipt.using(backend=alias).get_result(enqueued.id)
    assert result.return_value == {"order": 21, "attempt": 2} and result.attempts == 2
    assert count(alias, "shop_receipt", "WHERE order_id = 21") == 1


def test_the_backend_s_timeout_gives_an_attempt_up_and_it_never_commits(
    alias: str, django_project: dict[str, str], stopped: list[subprocess.Popen[str]]
) -> None:
    from shop.tasks import stuck_receipt

    stuck = stuck_receipt.using(backend=alias).enqueue(31, using=alias, seconds=2.0)
    worker = _worker(django_project, alias)
    stopped.append(worker)
    _until(lambda: _states(alias, "dead") == 1, worker, "the timed-out task's end")
    _stop(worker)  # the process ends once the task's thread has returned (it sleeps on)
    (row,) = _rows(alias)
    assert row.attempt == 1 and "Timeout" in row.error.split("\n", 1)[0]
    assert count(alias, "shop_receipt") == 0  # its work, done after the timeout, rolled back
    result = stuck_receipt.using(backend=alias).get_result(stuck.id)
    assert result.status.name == "FAILED"


def test_timeouts_come_from_the_backend_s_options(django_project: dict[str, str]) -> None:
    from oncely.contrib.django import Oncely, TaskBackend
    from oncely.errors import ConfigError

    app = Oncely(using="default")
    app.register_django_tasks()
    assert app.tasks.get("shop.tasks.stuck_receipt").timeout == 0.5  # TASK_TIMEOUT
    assert app.tasks.get("shop.tasks.send_receipt").timeout is None
    backend = TaskBackend("x", {"OPTIONS": {"TIMEOUT": timedelta(minutes=2)}})
    assert backend.timeout("a.b") == 120.0
    backend = TaskBackend("x", {"OPTIONS": {"TIMEOUT": 9, "TASK_TIMEOUT": {"a.b": 1.5}}})
    assert (backend.timeout("a.b"), backend.timeout("a.c")) == (1.5, 9.0)
    for bad in (0, -1, "30", True):
        with pytest.raises(ConfigError, match=r"TASKS\['x'\]\['OPTIONS'\]\['TIMEOUT'\]"):
            TaskBackend("x", {"OPTIONS": {"TIMEOUT": bad}}).timeout("a.b")
    with pytest.raises(ConfigError, match=r"TASK_TIMEOUT.*must be a dict"):
        TaskBackend("x", {"OPTIONS": {"TASK_TIMEOUT": 3}}).timeout("a.b")
