"""`oncely worker` runs scheduled jobs and queue tasks in one process, with one graceful stop."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from tests.apps import mixed
from tests.support import ROOT, run_cli, start_cli, wait_until

from oncely import Oncely, TaskState
from oncely.queue import list_tasks

APP = "tests.apps.mixed:app"


def scalar(engine: sa.Engine, query: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(query)).scalar_one())


@pytest.fixture
def env(db_url: str, sync_engine: sa.Engine, tmp_path: Path) -> dict[str, str]:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_APP": APP, "ONCELY_TEST_SIGNALS": str(tmp_path)}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    with sync_engine.begin() as conn:
        for ddl in mixed.TABLES:
            conn.exec_driver_sql(ddl)
    return env


async def enqueue(db_url: str, task: str, numbers: range) -> None:
    app = Oncely(db_url)
    target = {"record": mixed.record, "hang": mixed.hang}[task]
    async with AsyncSession(app.store.engine) as db, db.begin():
        await target.enqueue_many(db, [{"n": n} for n in numbers])
    await app.aclose()


def start_worker(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return start_cli("worker", *args, env=env)


async def test_one_worker_runs_job_slots_and_tasks(
    env: dict[str, str], db_url: str, sync_engine: sa.Engine
) -> None:
    await enqueue(db_url, "record", range(40))
    worker = start_worker(env, "--concurrency", "2")
    try:
        wait_until(lambda: scalar(sync_engine, "SELECT count(*) FROM effects") >= 40, "tasks")
        wait_until(lambda: scalar(sync_engine, "SELECT count(*) FROM ticks") >= 2, "job slots")
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    assert code == 0, worker.stderr.read()  # type: ignore[union-attr]
    with sync_engine.connect() as conn:
        effects = [r[0] for r in conn.execute(sa.text("SELECT n FROM effects ORDER BY n"))]
        ticks = [r[0] for r in conn.execute(sa.text("SELECT slot FROM ticks"))]
    assert effects == list(range(40))  # each task's effect exactly once
    assert len(ticks) == len(set(ticks))  # each slot at most once


async def test_sigterm_cancels_a_task_past_the_shutdown_timeout(
    env: dict[str, str], db_url: str, sync_engine: sa.Engine, tmp_path: Path
) -> None:
    await enqueue(db_url, "hang", range(1))
    worker = start_worker(env, "--concurrency", "1", "--shutdown-timeout", "0.5")
    wait_until(lambda: (tmp_path / "hanging-0").exists(), "the task to start")
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    # The hanging task's write was rolled back, and the task is waiting to run again.
    assert scalar(sync_engine, "SELECT count(*) FROM effects") == 0
    app = Oncely(db_url)
    (record,) = await list_tasks(app, task="hang")
    await app.aclose()
    # Handed back at once (its 30 s lease has not run out), the attempt not counted, and
    # recorded as cancelled by the shutdown, not as a worker that died.
    assert record.state is TaskState.AVAILABLE
    assert (record.attempt, record.locked_by, record.lease_expires_at) == (0, None, None)
    assert record.error is not None and record.error.startswith("Cancelled: the worker shut down")
    # The log lines come in the order things happened.
    order = ["worker.stopping", "worker.cancelling", "task.cancelled", "worker.shutdown"]
    at = [err.find(f"{event}:") for event in order]
    assert -1 not in at and at == sorted(at), err
    assert f"id={record.id}" in err.split("task.cancelled:")[1].splitlines()[0]
    assert "cancelled=1" in err.split("worker.shutdown:")[1].splitlines()[0]
