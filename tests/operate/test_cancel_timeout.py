"""Timeouts and cancel: the attempt's writes are gone afterwards, the slot is given up (no
process starts it again until an operator releases it), the outcome is recorded; a cancel
stops an attempt in another OS process within 5 s (Postgres: on SQLite the running attempt
holds the write lock a cancel needs, and it is refused)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from tests.operate.conftest import Env
from tests.support import snapshot, wait_until

SLOT = "2026-11-30T10:00:00Z"


def outcomes(env: Env, job: str) -> list[str]:
    rows = env.rows("SELECT outcome FROM oncely_attempts WHERE job = :j ORDER BY id", j=job)
    return [r[0] for r in rows]


def timed_out(env: Env, job: str) -> None:
    done = env.oncely("run", job, "--now", SLOT, "--json")
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    assert (data["status"], data["given_up"]) == ("timeout", True)
    assert "run.timeout" in done.stderr and "JobTimeoutError" in done.stderr


@pytest.mark.parametrize("job", ["slow", "slow_sync"])
def test_a_timeout_rolls_back_and_gives_the_slot_up_until_released(env: Env, job: str) -> None:
    timed_out(env, job)
    again = env.oncely("run", job, "--now", SLOT, "--json")  # given up: not started again
    assert again.returncode == 1, again.stderr  # its work did not happen: never exit 0
    assert json.loads(again.stdout)["attempts"] == 1
    assert json.loads(again.stdout)["status"] == "given_up"
    assert env.effects(job) == []
    assert env.rows("SELECT count(*) FROM oncely_runs")[0][0] == 0
    assert outcomes(env, job) == ["timeout"]
    assert env.rows("SELECT final FROM oncely_attempts")[0][0] in (True, 1)
    released = env.cli("release", job, SLOT)
    assert released.returncode == 0, released.stderr
    timed_out(env, job)  # released: the slot runs (and times out) once more
    assert env.effects(job) == []
    assert outcomes(env, job) == ["timeout", "timeout"]


def running(env: Env) -> bool:
    done = env.cli("explain", "hold", "--slot", SLOT, "--json")
    return bool(json.loads(done.stdout)["answer"] == "running")


@pytest.mark.postgres
def test_cancel_stops_an_attempt_in_another_process_within_5_s(pg_env: Env) -> None:
    env = pg_env
    holder = env.popen("run", "hold", "--now", SLOT, "--json")
    try:
        wait_until(lambda: Path(f"{env.tmp / 'release'}.started").exists(), "hold to start")
        wait_until(lambda: running(env), "its start to be recorded (after 1 s)", deadline=30)
        asked = env.cli("cancel", "hold", "--slot", SLOT, "--reason", "stuck", "--json")
        assert asked.returncode == 0, asked.stderr
        assert json.loads(asked.stdout)["status"] == "cancel requested"
        requested = time.monotonic()
        code = holder.wait(timeout=30)
        took = time.monotonic() - requested
    finally:
        (env.tmp / "release").touch()
        out, err = holder.communicate(timeout=30)
    assert code == 1, err
    assert json.loads(out)["status"] == "cancelled"
    assert took < 5, took
    assert env.effects("hold") == []  # its write rolled back
    assert outcomes(env, "hold") == ["cancelled"]
    assert [(a[0], a[2]) for a in env.audit()] == [("cancel", "cancel requested")]
    again = env.oncely("run", "hold", "--now", SLOT)  # a cancel is final: not started again
    assert again.returncode == 1 and "given_up hold" in again.stderr, again.stderr
    assert env.effects("hold") == []
    assert env.cli("release", "hold", SLOT).returncode == 0  # the operator frees it
    (env.tmp / "release").touch()
    once_more = env.oncely("run", "hold", "--now", SLOT)
    assert once_more.returncode == 0 and once_more.stdout.startswith("ran hold"), once_more.stderr
    assert len(env.effects("hold")) == 1


def test_cancel_on_sqlite_is_refused_while_the_attempt_holds_the_write_lock(
    tmp_path: Path, db_url: str, env: Env
) -> None:
    if not db_url.startswith("sqlite"):
        return  # Postgres: the test above
    holder = env.popen("run", "hold", "--now", SLOT)
    try:
        wait_until(lambda: Path(f"{env.tmp / 'release'}.started").exists(), "hold to start")
        before = snapshot(env.db_url)
        refused = env.cli("cancel", "hold")
        assert refused.returncode == 2
        assert "on SQLite a running attempt holds the database's write lock" in refused.stderr
        assert snapshot(env.db_url) == before
    finally:
        (env.tmp / "release").touch()
        holder.communicate(timeout=30)
    assert holder.returncode == 0


def test_cancel_of_a_task_that_has_not_started_discards_it(env: Env) -> None:
    enqueued = env.cli("enqueue", "chore", "--json", '{"n": 1}')
    assert enqueued.returncode == 0, enqueued.stderr
    done = env.cli("tasks", "cancel", "1", "--actor", "ops@test", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["status"], data["task"]["state"]) == ("discarded", "discarded")
    assert env.rows("SELECT state FROM oncely_tasks")[0][0] == "discarded"
    assert [(a[0], a[2]) for a in env.audit()] == [
        ("task_cancel", "discarded (it had not started)")
    ]
    explained = json.loads(env.cli("tasks", "explain", "1", "--json").stdout)
    assert explained["answer"] == "discarded" and "ops@test" in explained["sentence"]


@pytest.mark.postgres
def test_cancel_of_a_running_task_is_recorded_for_its_worker(pg_env: Env) -> None:
    env = pg_env
    assert env.cli("enqueue", "chore", "--json", '{"n": 1}').returncode == 0
    log = env.tmp / "worker.log"
    worker = env.popen("worker", "--jobs", "hourly", log=log)
    try:
        wait_until(lambda: Path(f"{env.tmp / 'release'}.started").exists(), "chore to start")
        done = env.cli("tasks", "cancel", "1", "--actor", "ops@test")
        assert done.returncode == 0, done.stderr
        assert "cancel requested for task 1" in done.stdout
        assert env.rows("SELECT task_id, requested_by FROM oncely_task_cancels") == [
            (1, "ops@test")
        ]
        explained = env.cli("tasks", "explain", "1").stdout
        assert "is running" in explained and "cancel was requested by ops@test" in explained
        twice = env.cli("tasks", "cancel", "1")
        assert twice.returncode == 2 and "already has a cancel request" in twice.stderr
    finally:
        (env.tmp / "release").touch()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert [(a[0], a[2]) for a in env.audit()] == [("task_cancel", "cancel requested (running)")]


async def test_the_store_tells_a_worker_which_running_tasks_to_cancel(db_url: str) -> None:
    from oncely import Oncely
    from oncely.store.control import Action

    app = Oncely(db_url)
    await app.migrate()
    store = app.store
    async with store.transaction() as conn:
        for n in (1, 2, 3):
            await conn.exec_driver_sql(
                "INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, created_at)"
                f" VALUES ('chore', 'default', '{{}}', 'running', 1, '2026-12-01 00:00:00',"
                f" '2026-12-01 00:00:0{n}')"
            )
    assert await store.control.cancel_requested([1, 2, 3]) == set()
    status, _ = await store.control.cancel_task(Action("ops", "task_cancel", "task 2"), 2)
    assert status == "cancel requested"
    assert await store.control.cancel_requested([1, 2, 3]) == {2}
    assert await store.control.cancel_requested([]) == set()
    await app.aclose()


async def test_a_cancel_wakes_the_watching_process_where_the_database_notifies(
    db_url: str,
) -> None:
    """Postgres: LISTEN/NOTIFY brings a cancel request to the process at once (the runner
    still polls its record, for SQLite and for a notification lost with its connection)."""
    import asyncio
    from datetime import datetime, timezone

    from oncely import Oncely
    from oncely.model import Attempt
    from oncely.store.control import Action

    app, operator = Oncely(db_url), Oncely(db_url)
    await app.migrate()
    await operator.store.ensure_schema()
    slot = datetime(2026, 11, 30, 10, tzinfo=timezone.utc)
    attempt_id = await app.store.control.start_attempt("hold", SLOT, slot, "web-1")
    assert attempt_id is not None
    signals = app.store.control.signals
    async with signals.watch(attempt_id) as cancelled:
        assert signals.listening is db_url.startswith("postgres")
        record = Attempt(attempt_id, "hold", SLOT, slot, None, "web-1", slot, None, slot)
        action = Action("ops@test", "cancel", f"hold {SLOT}", job="hold")
        assert await operator.store.control.cancel_attempts(action, [record]) == [attempt_id]
        if signals.listening:
            await asyncio.wait_for(cancelled.wait(), 5)
    assert signals.listening is False  # the last watcher closed the listening connection
    assert await app.store.control.cancel_request(attempt_id) == "ops@test"
    await app.aclose()
    await operator.aclose()
