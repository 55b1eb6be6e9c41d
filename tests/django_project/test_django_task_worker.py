"""`manage.py oncely worker` runs `django.tasks` tasks: each in `atomic()` on Django's
connection with its ack, retried per the backend's RetryPolicy, once per task across a
SIGKILL, in threads (a slow one delays no other); on SQLite and Postgres, in real processes."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from shop_helpers import count, manage

from oncely.store import Fence, dialect_for
from oncely.store import task_queue_sql as tasks_sql

NO_JOBS = "oncely.contrib.django.settings_app:app"
"""The app `manage.py oncely` loads when ONCELY names none: no jobs, so these workers run
only tasks (the shop's `tick` job would write every second)."""


def _worker(env: dict[str, str], alias: str, *args: str, **extra: str) -> subprocess.Popen[str]:
    return manage(env, alias, "oncely", "--app", NO_JOBS, "worker", *args, extra=extra)


def _stop(worker: subprocess.Popen[str]) -> tuple[str, str]:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, (out, err)
    return out, err


def _until(condition: Callable[[], bool], worker: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 90
    while not condition():
        assert worker.poll() is None, worker.communicate()
        assert time.monotonic() < deadline, f"{what} not within 90 s"
        time.sleep(0.1)


def _rows(alias: str) -> list[Any]:
    from oncely.contrib.django.models import TaskRow

    return list(TaskRow.objects.using(alias).order_by("id"))


def _states(alias: str, state: str) -> int:
    return count(alias, "oncely_tasks", "WHERE state = %s", [state])


@pytest.fixture
def stopped() -> Iterator[list[subprocess.Popen[str]]]:
    """Workers a test starts; any still running at its end are killed."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)


def test_the_app_registers_the_backend_s_tasks_with_their_queue_and_policy(alias: str) -> None:
    from oncely.contrib.django import Oncely
    from oncely.retry import DEFAULT_POLICY

    app = Oncely(using=alias)
    added = app.register_django_tasks()
    assert {"shop.tasks.send_receipt", "shop.tasks.mail_receipt"} <= set(added)
    assert "oncely.contrib.django.tasks.run_attempt" not in added
    assert app.register_django_tasks() == []  # once
    assert app.tasks.get("shop.tasks.mail_receipt").queue == "mail"
    assert app.tasks.get("shop.tasks.send_receipt").retry is DEFAULT_POLICY
    flaky = app.tasks.get("shop.tasks.flaky_receipt").retry
    assert flaky.attempts == 3 and flaky.base_wait(1) == 0


def test_retry_policies_come_from_the_backend_s_options() -> None:
    from oncely import RetryPolicy
    from oncely.contrib.django import TaskBackend

    every, one = RetryPolicy(attempts=2), RetryPolicy(attempts=7, discard_on=[LookupError])
    backend = TaskBackend("x", {"OPTIONS": {"RETRY": every, "TASK_RETRY": {"a.b": one}}})
    assert backend.retry_policy("a.b") is one and backend.retry_policy("a.c") is every
    assert TaskBackend("x", {}).retry_policy("a.b") is None  # oncely's default policy


def test_a_malformed_retry_setting_is_a_config_error_naming_it() -> None:
    from oncely.contrib.django import TaskBackend
    from oncely.errors import ConfigError

    backend = TaskBackend("x", {"OPTIONS": {"RETRY": {"attempts": 0}}})
    with pytest.raises(ConfigError, match=r"TASKS\['x'\]\['OPTIONS'\]\['RETRY'\].*attempts"):
        backend.retry_policy("shop.tasks.send_receipt")
    backend = TaskBackend("x", {"OPTIONS": {"TASK_RETRY": {"a.b": 3}}})
    with pytest.raises(ConfigError, match=r"TASK_RETRY.*must be a RetryPolicy"):
        backend.retry_policy("a.b")


def _leased(alias: str, order_id: int) -> tuple[int, Any, dict[str, Any]]:
    """A send_receipt task leased with token "tok": its id, the ack and its parameters."""
    from django.db import connections
    from shop.tasks import send_receipt

    from oncely.contrib.django.models import TaskRow

    result = send_receipt.using(backend=alias).enqueue(order_id, using=alias)
    task_id = int(result.id)
    TaskRow.objects.using(alias).filter(id=task_id).update(state="running", lease_token="tok")
    dialect = dialect_for(connections[alias].vendor)
    params = {"p_ids": [task_id], "p_token": "tok", **dialect.now_params()}
    return task_id, tasks_sql.ack(dialect.now_sql()), params


def test_run_attempt_commits_only_with_the_fence_open(alias: str) -> None:
    from oncely.contrib.django import run_attempt
    from oncely.contrib.django.tasks import AttemptGivenUp

    task_id, sql, params = _leased(alias, 1)
    closed = Fence()
    closed.close()
    call = ("shop.tasks.send_receipt", [1], {"using": alias}, sql, params)
    with pytest.raises(AttemptGivenUp, match="given up"):
        run_attempt(alias, *call, fence=closed)
    assert count(alias, "shop_receipt") == 0 and _rows(alias)[0].state == "running"
    fence = Fence()
    run_attempt(alias, *call, fence=fence)
    assert fence.lock.acquire(blocking=False)  # released after the commit
    assert count(alias, "shop_receipt") == 1 and _rows(alias)[0].state == "succeeded"
    assert _rows(alias)[0].id == task_id


def test_the_worker_runs_a_committed_task_once_and_never_a_rolled_back_one(
    alias: str, django_project: dict[str, str], stopped: list[subprocess.Popen[str]]
) -> None:
    from django.db import transaction
    from shop.tasks import send_receipt

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic(using=alias):
        send_receipt.using(backend=alias).enqueue(1, using=alias)
        raise Boom
    with transaction.atomic(using=alias):
        send_receipt.using(backend=alias).enqueue(2, using=alias)
    worker = _worker(django_project, alias, "--concurrency", "2")
    stopped.append(worker)
    _until(lambda: _states(alias, "succeeded") == 1, worker, "the task's run")
    _stop(worker)
    (row,) = _rows(alias)
    assert row.task == "shop.tasks.send_receipt" and row.attempt == 1
    assert count(alias, "shop_receipt", "WHERE order_id = 2") == 1
    assert count(alias, "shop_receipt") == 1


def test_a_task_that_raises_is_retried_per_its_policy(
    alias: str,
    django_project: dict[str, str],
    stopped: list[subprocess.Popen[str]],
    tmp_path: Path,
) -> None:
    from shop.tasks import flaky_receipt

    once, always = tmp_path / "once", tmp_path / "always"
    ok = flaky_receipt.using(backend=alias).enqueue(1, str(once), using=alias, fail=1)
    dead = flaky_receipt.using(backend=alias).enqueue(2, str(always), using=alias, fail=99)
    worker = _worker(django_project, alias, "--concurrency", "2")
    stopped.append(worker)
    _until(
        lambda: _states(alias, "succeeded") + _states(alias, "dead") == 2,
        worker,
        "both tasks' end",
    )
    _stop(worker)
    rows = {str(row.id): row for row in _rows(alias)}
    assert rows[ok.id].state == "succeeded" and rows[ok.id].attempt == 2
    assert len(once.read_text().splitlines()) == 2
    assert count(alias, "shop_receipt", "WHERE order_id = 1") == 1  # the failed try rolled back
    assert rows[dead.id].state == "dead" and rows[dead.id].attempt == 3  # attempts=3
    assert len(always.read_text().splitlines()) == 3
    assert "payment gateway timed out" in rows[dead.id].error
    assert count(alias, "shop_receipt", "WHERE order_id = 2") == 0


def test_sigkill_between_the_task_s_work_and_its_commit_then_another_worker_runs_it_once(
    alias: str, django_project: dict[str, str], stopped: list[subprocess.Popen[str]]
) -> None:
    from shop.tasks import send_receipt

    send_receipt.using(backend=alias).enqueue(7, using=alias)
    killed = _worker(django_project, alias, "--lease", "1", SHOP_KILL_TASK_BEFORE_COMMIT="1")
    stopped.append(killed)
    out, err = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, (out, err)
    (row,) = _rows(alias)
    assert row.state == "running" and row.attempt == 1  # its work and ack died uncommitted
    assert count(alias, "shop_receipt") == 0
    other = _worker(django_project, alias, "--lease", "1")
    stopped.append(other)
    _until(lambda: _states(alias, "succeeded") == 1, other, "the retry after the lease ran out")
    _stop(other)
    (row,) = _rows(alias)
    assert row.attempt == 2
    assert count(alias, "shop_receipt", "WHERE order_id = 7") == 1  # one effect


def test_a_slow_sync_task_delays_no_other_and_keeps_its_short_lease(
    alias: str, django_project: dict[str, str], stopped: list[subprocess.Popen[str]]
) -> None:
    from shop.tasks import send_receipt, slow_receipt

    slow = slow_receipt.using(backend=alias).enqueue(0, using=alias, seconds=3.0)
    for order_id in range(1, 51):
        send_receipt.using(backend=alias).enqueue(order_id, using=alias)
    worker = _worker(django_project, alias, "--concurrency", "4", "--lease", "1")
    stopped.append(worker)
    _until(lambda: _states(alias, "succeeded") == 51, worker, "the 51 tasks' runs")
    _stop(worker)
    rows = _rows(alias)
    (slow_row,) = [row for row in rows if str(row.id) == slow.id]
    short = [row for row in rows if row is not slow_row]
    assert slow_row.started_at < min(row.finished_at for row in short)  # it ran meanwhile ...
    assert max(row.finished_at for row in short) < slow_row.finished_at  # ... and ended last
    assert slow_row.attempt == 1 and all(row.attempt == 1 for row in short)  # no lease lost
    assert count(alias, "shop_receipt") == 51
    assert count(alias, "shop_receipt", "WHERE order_id = 0") == 1


def test_an_async_task_s_orm_work_commits_with_its_ack_or_rolls_back_with_its_error(
    alias: str, django_project: dict[str, str], stopped: list[subprocess.Popen[str]]
) -> None:
    from shop.tasks import async_numbered_receipt, async_receipt

    ok = async_receipt.using(backend=alias).enqueue(1, using=alias)
    failing = async_receipt.using(backend=alias).enqueue(2, using=alias, fail=True)
    numbered = async_numbered_receipt.using(backend=alias).enqueue(3, using=alias)
    worker = _worker(django_project, alias, "--concurrency", "2")
    stopped.append(worker)
    _until(
        lambda: _states(alias, "succeeded") + _states(alias, "dead") == 3,
        worker,
        "the async tasks' end",
    )
    _stop(worker)
    rows = {str(row.id): row for row in _rows(alias)}
    assert rows[ok.id].state == "succeeded" and rows[ok.id].attempt == 1
    assert async_receipt.using(backend=alias).get_result(ok.id).return_value["order"] == 1
    assert rows[numbered.id].state == "succeeded"
    assert async_numbered_receipt.using(backend=alias).get_result(numbered.id).return_value == 1
    # Two attempts (TASK_RETRY), each one's write rolled back with its error.
    assert rows[failing.id].state == "dead" and rows[failing.id].attempt == 2
    assert "order 2 failed after its write" in rows[failing.id].error
    assert count(alias, "shop_receipt", "WHERE order_id = 2") == 0
    assert count(alias, "shop_receipt", "WHERE order_id IN (1, 3)") == 2


def test_run_attempt_rolls_an_async_task_s_work_back_when_its_ack_matches_no_row(
    alias: str,
) -> None:
    from oncely.contrib.django import LeaseLostError, run_attempt

    _, sql, params = _leased(alias, 1)
    lost = {**params, "p_token": "another"}
    call = ("shop.tasks.async_receipt", [5], {"using": alias}, sql, lost)
    with pytest.raises(LeaseLostError, match="lease was lost"):
        run_attempt(alias, *call)
    assert count(alias, "shop_receipt", "WHERE order_id = 5") == 0  # rolled back
    run_attempt(alias, *call[:4], params)
    assert count(alias, "shop_receipt", "WHERE order_id = 5") == 1


def test_a_task_s_own_retry_and_timeout_come_from_its_decorator(
    alias: str,
    django_project: dict[str, str],
    stopped: list[subprocess.Popen[str]],
    tmp_path: Path,
) -> None:
    from shop import tasks

    if not tasks.TASK_OPTIONS:
        pytest.skip("Django 6.0's @task passes no options to the backend's task class")
    from oncely.contrib.django import Oncely

    app = Oncely(using=alias)
    app.register_django_tasks()
    patient = app.tasks.get("shop.tasks.patient_receipt")
    assert patient.retry.attempts == 2 and patient.timeout == 30
    marker = tmp_path / "marker"
    result = tasks.patient_receipt.using(backend=alias).enqueue(9, str(marker), using=alias)
    worker = _worker(django_project, alias)
    stopped.append(worker)
    _until(lambda: _states(alias, "dead") == 1, worker, "the task's last attempt")
    _stop(worker)
    (row,) = _rows(alias)
    assert str(row.id) == result.id and row.attempt == 2  # its own policy: two attempts
    assert len(marker.read_text().splitlines()) == 2
    assert count(alias, "shop_receipt") == 0


def test_a_task_s_own_options_are_checked_when_it_is_defined_and_settings_win() -> None:
    from shop import tasks

    from oncely import RetryPolicy
    from oncely.contrib.django import TaskBackend
    from oncely.contrib.django.tasks import InvalidTaskError

    if not tasks.TASK_OPTIONS:
        pytest.skip("Django 6.0's @task passes no options to the backend's task class")

    with pytest.raises(InvalidTaskError, match=r"@task of .*: retry: .*attempts"):
        tasks.task(retry={"attempts": 0})(tasks.send_receipt.func)
    with pytest.raises(InvalidTaskError, match=r"@task of .*: timeout must be"):
        tasks.task(timeout="soon")(tasks.send_receipt.func)
    path = "shop.tasks.patient_receipt"
    ours = RetryPolicy(attempts=9)
    backend = TaskBackend("x", {"OPTIONS": {"RETRY": RetryPolicy(attempts=4)}})
    assert backend.retry_policy(path, tasks.patient_receipt).attempts == 2  # its own
    assert backend.retry_policy("shop.tasks.send_receipt", tasks.send_receipt).attempts == 4
    backend = TaskBackend("x", {"OPTIONS": {"TASK_RETRY": {path: ours}}})
    assert backend.retry_policy(path, tasks.patient_receipt) is ours  # the setting wins
