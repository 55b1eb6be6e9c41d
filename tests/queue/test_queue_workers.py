"""Guarantee 6 with real worker processes and real SIGKILL, on SQLite and Postgres."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from tests.apps.queue_app import EFFECTS_DDL, hang, record, stall
from tests.apps.queue_soak import soak
from tests.apps.queue_soak import sync_engine as soak_engine
from tests.support import ROOT, run_cli, start_process, stop, wait_until

WORKER = [
    sys.executable,
    str(ROOT / "tests" / "apps" / "queue_worker.py"),
    "tests.apps.queue_app:app",
]


@pytest.fixture
def env(db_url: str, sync_engine: sa.Engine, tmp_path: Path) -> dict[str, str]:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_TEST_SIGNALS": str(tmp_path)}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    with sync_engine.begin() as conn:
        conn.exec_driver_sql(EFFECTS_DDL)
    return env


def sync_url(url: str) -> str:
    return soak_engine(url).url.render_as_string(hide_password=False)


def start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return start_process([*WORKER, *args], env=env)


def rows(engine: sa.Engine, query: str) -> list[tuple]:  # type: ignore[type-arg]
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(query))]


def test_queue_tasks_take_effect_once_worker_sigkilled_mid_task(
    env: dict[str, str], sync_engine: sa.Engine, tmp_path: Path
) -> None:
    """A worker dies with the task's write uncommitted; its lease runs out in database time;
    another worker runs the task again: one effect, from the second worker."""
    with Session(sync_engine) as session, session.begin():
        task_id = hang.enqueue_sync(session, n=1).id
    first = start(env, "--lease", "1", "--concurrency", "1")
    marker = wait_until(
        lambda: sorted(tmp_path.glob("started-1-*")), "the task to start", deadline=120
    )
    assert marker[0].name == f"started-1-{first.pid}"
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=30) == -signal.SIGKILL
    assert rows(sync_engine, "SELECT n FROM effects") == []
    (tmp_path / "release").touch()
    second = start(env, "--lease", "1", "--concurrency", "1")
    wait_until(
        lambda: (
            rows(sync_engine, f"SELECT state FROM oncely_tasks WHERE id = {task_id}")
            == [("succeeded",)]
        ),
        "the second worker to finish the task",
        deadline=120,
    )
    code, err = stop(second)
    assert code == 0
    assert rows(sync_engine, "SELECT n, pid FROM effects") == [(1, second.pid)]
    assert rows(sync_engine, "SELECT attempt FROM oncely_tasks") == [(2,)]
    assert "task.lease_expired" in err and f"id={task_id}" in err


def test_queue_tasks_take_effect_once_lease_stolen_from_a_stalled_worker(
    env: dict[str, str], db_url: str, sync_engine: sa.Engine, tmp_path: Path
) -> None:
    """A worker whose event loop stalls stops renewing its lease; another worker takes the task
    over and commits; the stalled one wakes up, fails its ack and rolls back: one effect."""
    if db_url.startswith("sqlite"):
        pytest.skip(
            "SQLite has one writer: a stalled worker's open transaction blocks every other "
            "writer, so its lease cannot be taken over (test_queue_execution covers the ack)"
        )
    with Session(sync_engine) as session, session.begin():
        task_id = stall.enqueue_sync(session, n=1, seconds=60).id
    workers = [start(env, "--lease", "1", "--concurrency", "1") for _ in range(2)]
    stalled_file = wait_until(
        lambda: sorted(tmp_path.glob("stalling-*")), "a worker to stall", deadline=120
    )
    stalled_pid = int(stalled_file[0].name.split("-")[1])
    wait_until(
        lambda: (
            rows(sync_engine, f"SELECT state FROM oncely_tasks WHERE id = {task_id}")
            == [("succeeded",)]
        ),
        "the other worker to take the task over",
        deadline=120,
    )
    (tmp_path / "release").touch()  # the stalled worker wakes up and tries to ack
    outputs = {p.pid: stop(p) for p in workers}
    assert all(code == 0 for code, _ in outputs.values())
    (effect,) = rows(sync_engine, "SELECT n, pid FROM effects")
    assert effect[0] == 1 and effect[1] != stalled_pid
    assert "task.lease_lost" in outputs[stalled_pid][1]
    assert rows(sync_engine, "SELECT attempt FROM oncely_tasks") == [(2,)]


def test_duplicates_are_observable_many_workers_one_effect_each(
    env: dict[str, str], sync_engine: sa.Engine, tmp_path: Path
) -> None:
    with Session(sync_engine) as session, session.begin():
        for n in range(300):
            record.enqueue_sync(session, n=n)
    workers = [start(env, "--concurrency", "3", "--batch", "5") for _ in range(3)]
    wait_until(
        lambda: (
            rows(sync_engine, "SELECT count(*) FROM oncely_tasks WHERE state = 'succeeded'")
            == [(300,)]
        ),
        "300 tasks",
        deadline=120,
    )
    # A worker slow to start may find no task left; it must still be up (its SIGTERM
    # handler installed) before it is asked to stop, or it dies of the signal instead.
    wait_until(
        lambda: all((tmp_path / f"ready-{p.pid}").exists() for p in workers),
        "every worker",
        deadline=120,
    )
    stopped = [stop(p) for p in workers]
    assert [code for code, _ in stopped] == [0, 0, 0], [err[-3000:] for _, err in stopped]
    assert rows(sync_engine, "SELECT count(*), count(DISTINCT n) FROM effects") == [(300, 300)]


def test_rolling_deploys_never_dead_letter_a_task_old_worker_leaves_new_ones(
    env: dict[str, str], sync_engine: sa.Engine, tmp_path: Path
) -> None:
    """Issue 13.1, guarantee 9: a worker of the previous release leases only the task names
    it knows. A task only the new release knows waits (attempt 0) while the old worker runs
    its own tasks around it, then a new worker runs it once, at attempt 1."""
    from tests.apps.queue_app_next import charge
    from tests.apps.queue_app_next import record as next_record

    old = start(env, "--concurrency", "2", "--poll", "0.05")
    wait_until(lambda: (tmp_path / f"ready-{old.pid}").exists(), "the old worker", deadline=120)
    with Session(sync_engine) as session, session.begin():
        task_id = charge.enqueue_sync(session, n=1).id
        later = next_record.enqueue_sync(session, n=2).id  # due after it, a name both know
    wait_until(
        lambda: (
            rows(sync_engine, f"SELECT state FROM oncely_tasks WHERE id = {later}")
            == [("succeeded",)]
        ),
        "the old worker to run the task it knows",
        deadline=120,
    )
    assert rows(sync_engine, f"SELECT state, attempt FROM oncely_tasks WHERE id = {task_id}") == [
        ("available", 0)
    ]
    # `oncely tasks` names the task that no live worker can run (the old one is live).
    listing = run_cli("tasks", cwd=ROOT, env={**env, "ONCELY_APP": "tests.apps.queue_app:app"})
    assert listing.returncode == 0, listing.stderr
    assert "note: 1 available 'charge' task(s) wait, and no live worker leases" in listing.stdout
    new = subprocess.Popen(
        [*WORKER[:2], "tests.apps.queue_app_next:app", "--concurrency", "2", "--poll", "0.05"],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(
        lambda: (
            rows(sync_engine, f"SELECT state FROM oncely_tasks WHERE id = {task_id}")
            == [("succeeded",)]
        ),
        "the new worker to run the new task",
        deadline=120,
    )
    listing = run_cli("tasks", cwd=ROOT, env={**env, "ONCELY_APP": "tests.apps.queue_app:app"})
    assert listing.returncode == 0 and "note:" not in listing.stdout  # it ran: none waits
    (old_code, old_err), (new_code, _) = stop(old), stop(new)
    assert (old_code, new_code) == (0, 0)
    assert rows(sync_engine, f"SELECT attempt FROM oncely_tasks WHERE id = {task_id}") == [(1,)]
    assert rows(sync_engine, "SELECT n, pid FROM effects ORDER BY n") == [
        (1, new.pid),
        (2, old.pid),
    ]
    assert "LookupError" not in old_err and "is registered" not in old_err
    assert rows(sync_engine, "SELECT count(*) FROM oncely_workers") == [(0,)]  # both stopped


@pytest.mark.timeout(900)  # the soak itself may take 240 s
def test_queue_tasks_take_effect_once_soak(
    db_url: str, env: dict[str, str], tmp_path: Path
) -> None:
    """3 workers, 10 % transient failures, a SIGKILL every 0.5 s (short form of the soak)."""
    # `env` migrated the database; the soak creates `effects` itself.
    with sa.create_engine(sync_url(db_url)).begin() as conn:
        conn.exec_driver_sql("DROP TABLE effects")
    result = soak(db_url, tasks=1200, workers=3, kill_every=0.5, timeout=240, signals=tmp_path)
    assert result.problems == []
    assert result.kills >= 1 and result.retries > 0
