"""Guarantees 1, 2 and 4 with real `oncely run` processes, on SQLite and Postgres."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.apps.leaderboard import create_tables
from tests.support import ROOT, run_cli, start_cli

APP = "tests.apps.leaderboard:app"
FRIDAY = "2026-11-27T18:0{}:00-06:00"  # a Friday, America/Mexico_City


@pytest.fixture
def env(db_url: str, sync_engine: sa.Engine, tmp_path: Path) -> dict[str, str]:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_APP": APP, "ONCELY_TEST_SIGNALS": str(tmp_path)}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    create_tables(sync_engine)
    return env


def coins(engine: sa.Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text("SELECT member, sum(amount) FROM coins GROUP BY member ORDER BY member")
            )
        ]


def notifications(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM notifications")).scalar_one()


def test_once_per_slot_the_incident(env: dict[str, str], sync_engine: sa.Engine) -> None:
    """Three replicas fire Friday 18:00 one minute apart: one payment, one notification each."""
    outputs = [
        run_cli("run", "leaderboard_close", "--now", FRIDAY.format(i), cwd=ROOT, env=env)
        for i in range(3)
    ]
    assert [p.returncode for p in outputs] == [0, 0, 0]
    assert [p.stdout.split()[0] for p in outputs] == ["ran", "skipped", "skipped"]
    assert "already ran" in outputs[1].stdout and "claimed by" in outputs[1].stdout
    assert "run.skipped: already ran, skipping" in outputs[2].stderr
    assert "job=leaderboard_close" in outputs[2].stderr
    assert "key=2026-11-28T00:00:00Z" in outputs[2].stderr
    assert coins(sync_engine) == [("ana", 10), ("beto", 10), ("carla", 10)]
    assert notifications(sync_engine) == 3


def test_once_per_slot_eight_processes_at_once(env: dict[str, str], sync_engine: sa.Engine) -> None:
    procs = [
        start_cli("run", "leaderboard_close", "--now", FRIDAY.format(0), env=env) for _ in range(8)
    ]
    results = [(p.wait(timeout=60), p.stdout.read().split()[0]) for p in procs]  # type: ignore[union-attr]
    statuses = sorted(status for _, status in results)
    assert all(code == 0 for code, _ in results)
    assert statuses.count("ran") == 1
    assert set(statuses) <= {"ran", "skipped", "busy"}
    assert coins(sync_engine) == [("ana", 10), ("beto", 10), ("carla", 10)]


def test_a_failed_attempt_leaves_no_partial_effect_and_records_the_slot_given_up(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    """Guarantee 2: a failed attempt leaves no partial effect; the slot's fate is recorded;
    it is retried only by the job's retry policy or by an operator's release."""
    slot = FRIDAY.format(0)
    failed = run_cli("run", "close_then_fail", "--now", slot, cwd=ROOT, env=env)
    assert failed.returncode == 1
    assert "RuntimeError: leaderboard service exploded" in failed.stderr
    assert "rolled back; given up (`oncely release close_then_fail " in failed.stderr
    assert coins(sync_engine) == [] and notifications(sync_engine) == 0
    # Given up: no process starts the slot again (no retry policy), until it is released.
    again = run_cli("run", "close_then_fail", "--now", slot, cwd=ROOT, env=env)
    assert again.returncode == 0 and again.stdout.startswith("given_up "), again.stderr
    key = again.stdout.split(" key ")[1].split(": ")[0]
    assert run_cli("release", "close_then_fail", key, cwd=ROOT, env=env).returncode == 0
    released = run_cli("run", "close_then_fail", "--now", slot, cwd=ROOT, env=env)
    assert released.returncode == 1 and "leaderboard service exploded" in released.stderr
    assert coins(sync_engine) == [] and notifications(sync_engine) == 0
    # The same slot of a job that works runs: the failed attempts left no claim.
    ran = run_cli("run", "leaderboard_close", "--now", slot, cwd=ROOT, env=env)
    assert ran.stdout.startswith("ran ")
    # The history shows only the successful run.
    hist = run_cli("history", "--json", cwd=ROOT, env=env)
    assert '"job": "close_then_fail"' not in hist.stdout


def _wait_for_file(directory: Path, prefix: str, deadline: float = 30.0) -> Path:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        found = sorted(directory.glob(prefix + "*"))
        if found:
            return found[0]
        time.sleep(0.01)
    raise AssertionError(f"no {prefix}* file within {deadline}s")


def _start(env: dict[str, str], job: str) -> subprocess.Popen[str]:
    return start_cli("run", job, "--now", FRIDAY.format(0), env=env)


def test_failure_frees_the_slot_after_sigkill(
    env: dict[str, str], sync_engine: sa.Engine, tmp_path: Path
) -> None:
    proc = _start(env, "close_then_hang")
    _wait_for_file(tmp_path, "started-")  # it has written its coins row, uncommitted
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert coins(sync_engine) == []
    (tmp_path / "release").touch()  # the retry's job will not hang
    retry = run_cli("run", "close_then_hang", "--now", FRIDAY.format(1), cwd=ROOT, env=env)
    assert retry.stdout.startswith("ran "), retry.stderr
    assert coins(sync_engine) == [("ana", 10)]


def test_losers_dont_wait_busy_while_a_slot_runs(
    env: dict[str, str], sync_engine: sa.Engine, tmp_path: Path
) -> None:
    holder = _start(env, "close_then_hang")
    _wait_for_file(tmp_path, "started-")
    started = time.monotonic()
    loser = run_cli("run", "close_then_hang", "--now", FRIDAY.format(2), cwd=ROOT, env=env)
    elapsed = time.monotonic() - started
    assert loser.returncode == 0
    assert loser.stdout.startswith("busy close_then_hang"), loser.stdout + loser.stderr
    # In the loser's own report: it took milliseconds, not the holder's lifetime.
    (tmp_path / "release").touch()
    assert holder.wait(timeout=30) == 0
    assert holder.stdout.read().startswith("ran ")  # type: ignore[union-attr]
    assert coins(sync_engine) == [("ana", 10)]
    assert elapsed < 10  # the holder only ends when we release it, after this returned


def test_a_job_that_commits_itself_lands_nothing(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    proc = run_cli("run", "close_and_commit", "--now", FRIDAY.format(0), cwd=ROOT, env=env)
    assert proc.returncode == 1
    assert "JobTransactionError" in proc.stderr and "commit()" in proc.stderr
    assert coins(sync_engine) == [] and notifications(sync_engine) == 0
