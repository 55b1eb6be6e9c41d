"""A task's fate in a fleet (the task fates of docs/design/fate.md), with real worker
processes, real SIGKILL and SIGSTOP: an attempt counts when its body starts, not when it is
leased; a worker of another release hands back what it cannot run, uncounted, saying why; a
worker that wakes from a stall past its lease cancels its attempts before they go on."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from tests.apps.queue_app import EFFECTS_DDL
from tests.support import ROOT, run_cli, start_process, stop, wait_until

WORKER = [sys.executable, str(ROOT / "tests" / "apps" / "queue_worker.py")]
V1 = "tests.apps.fate_app:app"
V2 = "tests.apps.fate_app_next:app"


@pytest.fixture
def env(db_url: str, sync_engine: sa.Engine, tmp_path: Path) -> dict[str, str]:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_TEST_SIGNALS": str(tmp_path)}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    with sync_engine.begin() as conn:
        conn.exec_driver_sql(EFFECTS_DDL)
    return env


_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def no_worker_left() -> Iterator[None]:
    """A test that fails midway leaves no worker process behind."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.communicate(timeout=30)


def start(env: dict[str, str], app: str, *args: str) -> subprocess.Popen[str]:
    proc = start_process([*WORKER, app, *args], env=env)
    _STARTED.append(proc)
    return proc


def n_of(args: object) -> int:
    """The `n` argument of a task row's args (JSON text on SQLite)."""
    return int((args if isinstance(args, dict) else json.loads(str(args)))["n"])


def rows(engine: sa.Engine, query: str) -> list[tuple]:  # type: ignore[type-arg]
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(query))]


def test_an_attempt_counts_when_its_body_starts_not_when_leased(
    env: dict[str, str], sync_engine: sa.Engine, tmp_path: Path
) -> None:
    """Issue: 3 workers at concurrency 4 lease twice that (4 run, 4 wait leased ahead); one is
    SIGKILLed. Its 4 started tasks (one attempt each) end dead, its 4 never-started ones
    keep their only attempt and run once on the others: 4 dead, not 8."""
    from tests.apps.fate_app import napper

    with Session(sync_engine) as session, session.begin():
        for n in range(24):
            napper.enqueue_sync(session, n=n)
    workers = [start(env, V1, "--concurrency", "4", "--lease", "2") for _ in range(3)]
    wait_until(
        lambda: len(list(tmp_path.glob("started-*"))) == 12, "12 tasks to start", deadline=120
    )
    wait_until(
        lambda: (
            rows(sync_engine, "SELECT count(*) FROM oncely_tasks WHERE state = 'running'")
            == [(24,)]
        ),
        "every task to be leased (4 running, 4 ahead per worker)",
        deadline=120,
    )
    victim = workers[0]
    started = {int(p.name.split("-")[1]) for p in tmp_path.glob(f"started-*-{victim.pid}")}
    assert len(started) == 4
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL
    mine = rows(
        sync_engine,
        "SELECT attempt, count(*) FROM oncely_tasks "
        f"WHERE locked_by LIKE '%\\:{victim.pid}' GROUP BY attempt ORDER BY attempt",
    )
    assert mine == [(0, 4), (1, 4)]  # leased ahead: not counted; started: counted
    (tmp_path / "release").touch()
    wait_until(
        lambda: (
            rows(
                sync_engine,
                "SELECT count(*) FROM oncely_tasks WHERE state IN ('succeeded', 'dead')",
            )
            == [(24,)]
        ),
        "every task to end",
        deadline=120,
    )
    outputs = [stop(p) for p in workers[1:]]
    assert [code for code, _ in outputs] == [0, 0]
    # The started ones: their one attempt began and never finished (attempt 2 found it
    # spent); the leased-ahead ones ran once, at attempt 1.
    dead = rows(sync_engine, "SELECT args, attempt, error FROM oncely_tasks WHERE state = 'dead'")
    assert {n_of(args) for args, _, _ in dead} == started
    assert all(a == 2 and "attempt 1 of 1 never finished" in e for _, a, e in dead)
    succeeded = "SELECT attempt, count(*) FROM oncely_tasks WHERE state = 'succeeded' GROUP BY 1"
    assert rows(sync_engine, succeeded) == [(1, 20)]
    effects = rows(sync_engine, "SELECT n FROM effects")
    assert len(effects) == 20 and {n for (n,) in effects} == set(range(24)) - started


def test_rolling_deploys_never_dead_letter_a_task_with_a_new_argument(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    """Issue, guarantee 9: v2 adds `currency` to `eff` and enqueues with it; the v1 worker
    leases those tasks, cannot bind their arguments, and hands them back uncounted (later
    each time), saying why; `oncely tasks`, `tasks show` and `tasks explain` say what they
    wait for. A v2 worker then runs each once, at attempt 1."""
    from tests.apps.fate_app_next import eff

    old = start(env, V1, "--concurrency", "2", "--poll", "0.05")
    with Session(sync_engine) as session, session.begin():
        ids = [eff.enqueue_sync(session, n=n, currency="eur").id for n in range(3)]
    listed = ",".join(map(str, ids))

    def turned_away() -> bool:
        got = rows(
            sync_engine,
            f"SELECT state, attempt, error FROM oncely_tasks WHERE id IN ({listed})",
        )
        return all(
            s == "available" and a == 0 and (e or "").startswith("Unrunnable:") for s, a, e in got
        )

    wait_until(turned_away, "the v1 worker to hand the tasks back", deadline=120)
    cli_env = {**env, "ONCELY_APP": V1}
    listing = run_cli("tasks", cwd=ROOT, env=cli_env)
    assert listing.returncode == 0, listing.stderr
    assert "waiting for a worker whose `eff` accepts `currency`" in listing.stdout
    shown = run_cli("tasks", "show", str(ids[0]), cwd=ROOT, env=cli_env)
    assert shown.returncode == 0 and "whose `eff` accepts `currency`" in shown.stdout
    told = run_cli("tasks", "explain", str(ids[0]), cwd=ROOT, env=cli_env)
    assert told.returncode == 0, told.stderr
    assert "answer: unrunnable" in told.stdout
    assert "waiting for a worker whose `eff` accepts `currency`" in told.stdout
    new = start(env, V2, "--concurrency", "2", "--poll", "0.05")
    wait_until(
        lambda: (
            rows(
                sync_engine,
                f"SELECT count(*) FROM oncely_tasks WHERE id IN ({listed}) AND state = 'succeeded'",
            )
            == [(3,)]
        ),
        "the v2 worker to run the tasks",
        deadline=120,
    )
    (old_code, old_err), (new_code, _) = stop(old), stop(new)
    assert (old_code, new_code) == (0, 0)
    assert rows(sync_engine, f"SELECT attempt FROM oncely_tasks WHERE id IN ({listed})") == [
        (1,),
        (1,),
        (1,),
    ]
    assert rows(sync_engine, "SELECT n, pid FROM effects ORDER BY n") == [
        (1000, new.pid),
        (1001, new.pid),
        (1002, new.pid),
    ]
    assert "task.handed_back" in old_err and "TypeError" not in old_err
    assert "task.dead" not in old_err


class Outside:
    """The outside service a task calls: it records each call (pid, start, end) and answers
    when the call's seconds are over."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float, float | None]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query)
                pid, seconds = int(query["pid"][0]), float(query["seconds"][0])
                with outer.lock:
                    index = len(outer.calls)
                    outer.calls.append((pid, time.monotonic(), None))
                time.sleep(seconds)  # the call's own duration, on the service's side
                with outer.lock:
                    outer.calls[index] = (pid, outer.calls[index][1], time.monotonic())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def snapshot(self) -> list[tuple[int, float, float | None]]:
        with self.lock:
            return list(self.calls)

    def most_at_once(self) -> int:
        calls = self.snapshot()
        ends = [(s, 1) for _, s, _ in calls] + [(e, -1) for _, _, e in calls if e is not None]
        level = most = 0
        for _, step in sorted(ends, key=lambda x: (x[0], x[1])):
            level += step
            most = max(most, level)
        return most


@pytest.fixture
def outside() -> Iterator[Outside]:
    service = Outside()
    yield service
    service.server.shutdown()


def test_a_worker_woken_from_a_stall_past_its_lease_cancels_its_attempt(
    env: dict[str, str], db_url: str, sync_engine: sa.Engine, outside: Outside
) -> None:
    """Issue: a task limited to one at a time makes outside calls (2 s each, lease 3 s). Its
    worker is SIGSTOPped during the first call; the lease runs out, another worker runs the
    task; the stalled one is woken (SIGCONT) while the other still calls. It cancels its
    attempt before its code goes on: no call of its own after the stall, never two calls at
    once, and one effect."""
    if db_url.startswith("sqlite"):
        pytest.skip(
            "SQLite has one writer: a stalled worker may hold the write lock, so its lease "
            "cannot be taken over (test_queue_workers' stalled-worker test says the same)"
        )
    from tests.apps.fate_app import outside as outside_task

    env = {**env, "ONCELY_TEST_OUTSIDE": outside.address}
    with Session(sync_engine) as session, session.begin():
        task_id = outside_task.enqueue_sync(session, n=1, calls=4, seconds=2.0).id
    first = start(env, V1, "--concurrency", "2", "--lease", "3")
    wait_until(lambda: outside.snapshot(), "the first call", deadline=120)
    first.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    second = start(env, V1, "--concurrency", "2", "--lease", "3")
    try:
        wait_until(
            lambda: any(pid == second.pid for pid, _, _ in outside.snapshot()),
            "the second worker to take the task over",
            deadline=120,
        )
    finally:
        first.send_signal(signal.SIGCONT)
    woken_at = time.monotonic()
    wait_until(
        lambda: (
            rows(sync_engine, f"SELECT state FROM oncely_tasks WHERE id = {task_id}")
            == [("succeeded",)]
        ),
        "the task to succeed",
        deadline=120,
    )
    (first_code, first_err), (second_code, _) = stop(first), stop(second)
    assert (first_code, second_code) == (0, 0)
    calls = outside.snapshot()
    stalled = [c for c in calls if c[0] == first.pid]
    assert len(stalled) == 1 and stalled[0][1] < stopped_at  # the call before the stall
    assert not any(c[0] == first.pid and c[1] >= woken_at for c in calls)
    assert outside.most_at_once() == 1
    assert [c[0] for c in calls].count(second.pid) == 4
    assert rows(sync_engine, "SELECT n, pid FROM effects") == [(1, second.pid)]
    assert "worker.stalled" in first_err and "task.lease_lost" in first_err
