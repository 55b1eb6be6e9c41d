"""Guarantees 1, 2 and 4 with real `oncely run` processes, on SQLite and Postgres."""

from __future__ import annotations

import json
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


def test_failure_frees_the_slot_for_the_schedulers_retry(
    env: dict[str, str], sync_engine: sa.Engine, tmp_path: Path
) -> None:
    """Guarantee 2, the seed's deployment: EventBridge retries a failed `oncely run`. A
    transient failure rolls back (exit 1, no partial effect) and leaves the slot free for the
    retry, which runs it: the members are paid once."""
    slot = FRIDAY.format(0)
    (tmp_path / "fail").touch()
    failed = run_cli("run", "close_when_up", "--now", slot, cwd=ROOT, env=env)
    assert failed.returncode == 1, failed.stderr
    assert "ConnectionError: the leaderboard service is down" in failed.stderr
    assert "the job's retry policy retries it at" in failed.stderr
    assert "(attempt 1 failed)" in failed.stderr
    assert coins(sync_engine) == [] and notifications(sync_engine) == 0
    (tmp_path / "fail").unlink()
    retried = run_cli("run", "close_when_up", "--now", slot, cwd=ROOT, env=env)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.startswith("ran close_when_up "), retried.stdout
    assert coins(sync_engine) == [("ana", 10), ("beto", 10), ("carla", 10)]
    again = run_cli("run", "close_when_up", "--now", slot, cwd=ROOT, env=env)
    assert again.returncode == 0 and again.stdout.startswith("skipped "), again.stdout
    assert coins(sync_engine) == [("ana", 10), ("beto", 10), ("carla", 10)]


def test_a_spent_budget_is_loud_until_an_operator_settles_the_slot(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    """Guarantee 2: each failed attempt leaves no partial effect and spends one of the slot's
    five attempts (counted across every `oncely run`); a spent budget exits 1 with "given up
    after 5 attempts" and the commands that settle it, and is a verify finding until an
    operator releases it (a fresh budget) or skips it on purpose (then accounted for)."""
    slot = FRIDAY.format(0)
    for attempt in range(1, 6):
        failed = run_cli("run", "close_then_fail", "--now", slot, cwd=ROOT, env=env)
        assert failed.returncode == 1, failed.stderr
        assert "RuntimeError: leaderboard service exploded" in failed.stderr
        if attempt < 5:
            assert f"(attempt {attempt} failed)" in failed.stderr, failed.stderr
    assert "given up after 5 attempts (`oncely release close_then_fail " in failed.stderr
    assert coins(sync_engine) == [] and notifications(sync_engine) == 0
    spent = run_cli("run", "close_then_fail", "--now", slot, cwd=ROOT, env=env)
    line = next(ln for ln in spent.stderr.splitlines() if ln.startswith("given_up "))
    assert spent.returncode == 1 and "given up after 5 attempts; not started" in line
    assert "WARNING oncely run.given_up" in spent.stderr and "attempts=5" in spent.stderr
    key = line.split(" key ")[1].split(": ")[0]
    since = ("--since", "2026-11-27T00:00:00Z", "--until", "2026-11-28T00:00:00Z")
    found = run_cli("verify", "close_then_fail", *since, "--json", cwd=ROOT, env=env)
    assert found.returncode == 1, found.stdout
    assert [f["kind"] for f in json.loads(found.stdout)["findings"]] == ["given_up"]
    # Released: a fresh budget, and it runs (and fails) again.
    assert run_cli("release", "close_then_fail", key, cwd=ROOT, env=env).returncode == 0
    released = run_cli("run", "close_then_fail", "--now", slot, cwd=ROOT, env=env)
    assert released.returncode == 1 and "(attempt 1 failed)" in released.stderr
    # Skipped on purpose: no process starts it, `run` exits 0, verify accounts for it.
    skip = ("skip", "close_then_fail", key, "--reason", "paid by hand", "--actor", "ana@ops")
    assert run_cli(*skip, cwd=ROOT, env=env).returncode == 0
    settled = run_cli("run", "close_then_fail", "--now", slot, cwd=ROOT, env=env)
    assert settled.returncode == 0, settled.stderr
    assert settled.stdout.startswith("skipped_on_purpose "), settled.stdout
    assert "by ana@ops: paid by hand" in settled.stdout
    ok = run_cli("verify", "close_then_fail", *since, "--json", cwd=ROOT, env=env)
    assert ok.returncode == 0, ok.stdout
    assert json.loads(ok.stdout)["jobs"][0]["counts"] == {"skipped": 1}
    assert coins(sync_engine) == [] and notifications(sync_engine) == 0
    # The same slot of a job that works runs: the failed attempts left no claim.
    ran = run_cli("run", "leaderboard_close", "--now", slot, cwd=ROOT, env=env)
    assert ran.stdout.startswith("ran ")
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
