"""Concurrency and rate limits under real races: worker processes, real SIGKILL, intervals
and starts read from the database's clock, on SQLite and Postgres."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from tests.apps.limits_app import INTERVALS_DDL, keyed, paced, three
from tests.support import ROOT, run_cli

WORKER = [sys.executable, str(ROOT / "tests" / "apps" / "queue_worker.py")]
APP = "tests.apps.limits_app:app"


@pytest.fixture
def env(db_url: str, sync_engine: sa.Engine, tmp_path: Path) -> dict[str, str]:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_TEST_SIGNALS": str(tmp_path)}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    with sync_engine.begin() as conn:
        conn.exec_driver_sql(INTERVALS_DDL)
    return env


def start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*WORKER, APP, "--concurrency", "10", "--poll", "0.1", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def count(engine: sa.Engine, query: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(query)).scalar_one())


def a_holder(engine: sa.Engine, procs: list[subprocess.Popen[str]]) -> int:
    """The index in `procs` of a live worker that holds a task's lease now (its replica id,
    `host:pid`, in `locked_by`), else of any: a kill that hits a holder shows a takeover."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT locked_by FROM oncely_tasks WHERE state = 'running'"))
        pids = {by.rpartition(":")[2] for (by,) in rows if by}
    holding = [i for i, proc in enumerate(procs) if str(proc.pid) in pids and proc.poll() is None]
    return random.choice(holding) if holding else random.randrange(len(procs))


def wait_for(engine: sa.Engine, n: int, procs: list[subprocess.Popen[str]], limit: float) -> None:
    """Poll until `n` intervals are recorded (every worker must stay alive meanwhile)."""
    deadline = time.monotonic() + limit
    while count(engine, "SELECT count(*) FROM intervals") < n:
        for proc in procs:
            if proc.poll() is not None and proc.returncode != -signal.SIGKILL:
                raise AssertionError(f"a worker exited with {proc.returncode}: {proc.stderr}")
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {n} intervals within {limit} s")
        time.sleep(0.05)


def stop_all(procs: list[subprocess.Popen[str]], signals: Path | None = None) -> None:
    """SIGTERM every live worker, each once it is consuming (`ready-<pid>` in `signals`): a
    worker replaced just before the end could otherwise get the signal while it starts, before
    its handler is installed, and die of it (-15) instead of stopping (0)."""
    if signals is not None:
        deadline = time.monotonic() + 60
        for proc in procs:
            while proc.poll() is None and not (signals / f"ready-{proc.pid}").exists():
                assert time.monotonic() < deadline, f"worker {proc.pid} never started consuming"
                time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in (0, -signal.SIGKILL), err[-2000:]


def intervals(engine: sa.Engine) -> list[tuple[int, str, float, float]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT n, k, s, e FROM intervals ORDER BY s"))
        return [(r[0], r[1], float(r[2]), float(r[3])) for r in rows]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end at t closes before a start at t)."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def enqueue(engine: sa.Engine, task, items: list[dict[str, object]]) -> None:  # type: ignore[no-untyped-def]
    with Session(engine) as session, session.begin():
        for item in items:
            task.enqueue_sync(session, **item)


def assert_each_ran_once(engine: sa.Engine, n: int) -> None:
    assert count(engine, "SELECT count(*) FROM intervals") == n
    assert count(engine, "SELECT count(DISTINCT n) FROM intervals") == n
    assert count(engine, "SELECT count(*) FROM oncely_tasks WHERE state = 'succeeded'") == n


def assert_keys_never_overlap(engine: sa.Engine) -> None:
    by_key: dict[str, list[tuple[float, float]]] = {}
    for _, key, s, e in intervals(engine):
        by_key.setdefault(key, []).append((s, e))
    assert len(by_key) == 8
    for key, spans in by_key.items():
        assert most_at_once(spans) == 1, f"two attempts of key {key} overlapped"


_KEYS = [f"k{i % 8}" for i in range(400)]
random.Random(16).shuffle(_KEYS)  # not round-robin: lanes taking turns would never collide
KEYED = [{"n": i, "key": key} for i, key in enumerate(_KEYS)]


def test_a_concurrency_key_of_1_never_overlaps_4_workers_x_10(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    """400 tasks over 8 keys with concurrency=1, 4 worker processes of 10 lanes each: every
    task ran once and no two intervals of one key overlap (database clock)."""
    enqueue(sync_engine, keyed, KEYED)
    procs = [start(env, "--lease", "5", "--batch", "1") for _ in range(4)]
    try:
        wait_for(sync_engine, 400, procs, 240)
    finally:
        stop_all(procs, Path(env["ONCELY_TEST_SIGNALS"]))
    assert_each_ran_once(sync_engine, 400)
    assert_keys_never_overlap(sync_engine)


@pytest.mark.timeout(400)  # workers killed every second: their keys wait out a 1 s lease
def test_a_concurrency_key_of_1_never_overlaps_with_a_worker_sigkilled_every_second(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    """The same with one of the 4 workers SIGKILLed (and replaced) every second for 12 s, a
    worker that holds a lease when there is one: a killed holder's attempt rolls back, its
    key frees when its lease runs out, another worker takes the task; still no overlap,
    every task once."""
    enqueue(sync_engine, keyed, KEYED)
    procs = [start(env, "--lease", "1", "--batch", "1") for _ in range(4)]
    killed = 0
    try:
        for _ in range(12):
            time.sleep(1.0)  # the fault's own pace: a kill each second, not a synchronization
            victim = a_holder(sync_engine, procs[:4])
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(timeout=30)
            killed += 1
            procs.append(start(env, "--lease", "1", "--batch", "1"))
            procs[victim], procs[-1] = procs[-1], procs[victim]
        wait_for(sync_engine, 400, procs[:4], 300)
    finally:
        stop_all(procs, Path(env["ONCELY_TEST_SIGNALS"]))
    assert killed == 12
    assert_each_ran_once(sync_engine, 400)
    assert_keys_never_overlap(sync_engine)
    # Killed holders' attempts were taken over after their leases: attempts beyond one.
    assert count(sync_engine, "SELECT count(*) FROM oncely_tasks WHERE attempt > 1") > 0


def test_a_global_limit_of_3_holds_across_4_workers_x_10(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    """A task with concurrency=3 and no key: never more than 3 attempts at once, anywhere."""
    enqueue(sync_engine, three, [{"n": i} for i in range(150)])
    procs = [start(env, "--lease", "5", "--batch", "1") for _ in range(4)]
    try:
        wait_for(sync_engine, 150, procs, 240)
    finally:
        stop_all(procs, Path(env["ONCELY_TEST_SIGNALS"]))
    assert_each_ran_once(sync_engine, 150)
    spans = [(s, e) for _, _, s, e in intervals(sync_engine)]
    assert most_at_once(spans) <= 3


@pytest.mark.timeout(400)  # workers killed every second
def test_a_global_limit_of_3_holds_with_a_worker_sigkilled_every_second(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    enqueue(sync_engine, three, [{"n": i} for i in range(150)])
    procs = [start(env, "--lease", "1", "--batch", "1") for _ in range(4)]
    try:
        for _ in range(8):
            time.sleep(1.0)  # the fault's own pace
            victim = random.randrange(len(procs))
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(timeout=30)
            procs[victim] = start(env, "--lease", "1", "--batch", "1")
        wait_for(sync_engine, 150, procs, 300)
    finally:
        stop_all(procs, Path(env["ONCELY_TEST_SIGNALS"]))
    assert_each_ran_once(sync_engine, 150)
    assert most_at_once([(s, e) for _, _, s, e in intervals(sync_engine)]) <= 3


def test_a_rate_of_50_per_second_across_3_workers(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    """300 tasks at rate="50/s", 3 workers: at most 50 attempts start in any 1-second window
    (their lease times, database clock), so the drain spans at least 5 s."""
    enqueue(sync_engine, paced, [{"n": i} for i in range(300)])
    procs = [start(env, "--lease", "5") for _ in range(3)]
    try:
        wait_for(sync_engine, 300, procs, 240)
    finally:
        stop_all(procs, Path(env["ONCELY_TEST_SIGNALS"]))
    assert_each_ran_once(sync_engine, 300)
    with sync_engine.connect() as conn:
        starts = sorted(
            r[0].timestamp() if hasattr(r[0], "timestamp") else _sqlite_time(r[0])
            for r in conn.execute(sa.text("SELECT started_at FROM oncely_tasks"))
        )
    j = 0
    for i, t in enumerate(starts):  # every window [t, t + 1 s) that opens at a start
        while j < len(starts) and starts[j] < t + 1.0:
            j += 1
        assert j - i <= 50, f"{j - i} starts within 1 s of {t}"
    assert starts[-1] - starts[0] >= 5.0 - 0.01


def _sqlite_time(text: str) -> float:
    from datetime import datetime, timezone

    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()
