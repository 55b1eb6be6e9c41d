"""Every `oncely` command on an app built on the user's own AsyncEngine (asyncpg and
psycopg), in real processes: one command's database calls share one event loop, so the
user's pool never hands a connection to a loop it was not opened on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from tests.conftest import _reset_postgres
from tests.support import ROOT, run_cli

APP = "tests.apps.user_engine:jobs"
SLOT = "2026-11-27T04:00:00+01:00"
DRIVERS = [
    pytest.param("asyncpg", marks=pytest.mark.postgres),
    pytest.param("psycopg", marks=pytest.mark.postgres),
]


@pytest.fixture(params=DRIVERS)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    url: str = request.getfixturevalue("postgres_database")
    _reset_postgres(url)
    engine_url = make_url(url).set(drivername=f"postgresql+{request.param}")
    env = {
        "ONCELY_APP": APP,
        "ONCELY_TEST_ENGINE_URL": engine_url.render_as_string(hide_password=False),
        "ONCELY_TEST_SIGNALS": str(tmp_path),
    }
    env.pop("ONCELY_DATABASE_URL", None)
    migrated = cli("migrate", env=env)
    assert "to version" in migrated.stdout
    return env


def cli(*args: str, env: dict[str, str], code: int = 0) -> subprocess.CompletedProcess[str]:
    """Run one command; it must exit with `code` and never print a traceback."""
    out = run_cli(*args, cwd=ROOT, env=env)
    assert "Traceback" not in out.stderr, out.stderr
    assert "different loop" not in out.stderr, out.stderr
    assert out.returncode == code, (args, out.stdout, out.stderr)
    return out


def test_read_commands(env: dict[str, str]) -> None:
    cli("enqueue", "send_receipt", "--json", '{"order_id": 1}', env=env)
    table = cli("tasks", env=env).stdout
    assert "send_receipt" in table and "available" in table
    assert json.loads(cli("tasks", "--json", env=env).stdout)[0]["args"] == {"order_id": 1}
    assert "send_receipt" in cli("tasks", "--state", "available", env=env).stdout
    assert "send_receipt" in cli("tasks", "show", "1", env=env).stdout
    assert json.loads(cli("tasks", "explain", "1", "--json", env=env).stdout)["task"]["id"] == 1
    listed = json.loads(cli("list", "--json", env=env).stdout)
    assert {entry["name"] for entry in listed} >= {"purge", "hold", "send_receipt"}
    assert cli("next", "purge", env=env).stdout.strip()
    assert cli("history", env=env).returncode == 0
    assert "purge" in cli("explain", "purge", "--slot", SLOT, env=env).stdout
    assert "eventbridge" not in cli("export", "crontab", env=env).stderr
    assert "is up to date" in cli("migrate", env=env).stdout


def test_run_then_operate(env: dict[str, str]) -> None:
    ran = cli("run", "purge", "--now", SLOT, env=env)
    assert ran.stdout.startswith("ran purge slot")
    skipped = json.loads(cli("run", "purge", "--now", SLOT, "--json", env=env).stdout)
    assert skipped["status"] == "skipped"
    key = json.loads(cli("history", "purge", "--json", env=env).stdout)[0]["key"]
    assert "released purge" in cli("release", "purge", key, env=env).stdout
    assert (
        "would run"
        in cli(
            "backfill",
            "purge",
            "--from",
            "2026-11-27T00:00:00Z",
            "--to",
            "2026-11-29T00:00:00Z",
            env=env,
        ).stdout
    )
    applied = cli(
        "backfill",
        "purge",
        "--from",
        "2026-11-27T00:00:00Z",
        "--to",
        "2026-11-29T00:00:00Z",
        "--apply",
        env=env,
    )
    assert applied.stdout.count("ran purge") == 2
    assert "paused purge" in cli("pause", "purge", "--reason", "incident", env=env).stdout
    assert "resumed purge" in cli("resume", "purge", env=env).stdout
    assert "moved 2 claims" in cli("rename", "purge", "purge_v2", "--force", env=env).stdout
    assert "pause" in cli("audit", env=env).stdout
    assert "pruned" in cli("prune", "--older-than", "1h", env=env).stdout


def _started(directory: Path) -> bool:
    return any(p.name.startswith("started-") for p in directory.iterdir())


def test_run_wait_on_a_busy_slot(env: dict[str, str], tmp_path: Path) -> None:
    full = {**os.environ, **env}
    command = [sys.executable, "-m", "oncely", "run", "hold", "--now", SLOT]
    holder = subprocess.Popen(command, cwd=ROOT, env=full, text=True, stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not _started(tmp_path):
            assert time.monotonic() < deadline and holder.poll() is None
            time.sleep(0.02)
        cancel = cli("cancel", "hold", "--slot", SLOT, "--json", env=env)
        assert json.loads(cancel.stdout)["status"] == "cancel requested"
        assert holder.wait(60) == 1  # the cancel rolled the holder back
        given_up = cli("run", "hold", "--now", SLOT, "--json", env=env, code=1)
        assert json.loads(given_up.stdout)["status"] == "given_up"  # a cancel is final
        key = json.loads(given_up.stdout)["key"]
        assert "given up" in cli("release", "hold", key, env=env).stdout
        for p in tmp_path.glob("started-*"):
            p.unlink()
        holder = subprocess.Popen(command, cwd=ROOT, env=full, text=True, stdout=subprocess.PIPE)
        while not _started(tmp_path):
            assert time.monotonic() < deadline and holder.poll() is None
            time.sleep(0.02)
        waiter = subprocess.Popen(
            [*command, "--wait", "60"],
            cwd=ROOT,
            env=full,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert waiter.stderr is not None
        for line in waiter.stderr:  # the log event, then the result line, then it waits
            if line.startswith("busy hold"):
                break
        (tmp_path / "release").touch()
        out, err = waiter.communicate(timeout=60)
        assert "Traceback" not in err and "different loop" not in err, err
        assert waiter.returncode == 0 and "ran" in out, (out, err)
        assert holder.wait(60) == 0
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture
def worker(env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "oncely", "worker", "--jobs", "purge"],
        cwd=ROOT,
        env={**os.environ, **env},
        text=True,
        stderr=subprocess.PIPE,
    )
    yield proc
    proc.kill()
    proc.wait()


def test_worker_and_task_commands(env: dict[str, str], worker: subprocess.Popen[str]) -> None:
    cli("enqueue", "send_receipt", "--json", '{"order_id": 2}', env=env)
    cli("enqueue", "leaky_task", env=env)
    deadline = time.monotonic() + 60
    while True:
        states = {t["task"]: t["state"] for t in json.loads(cli("tasks", "--json", env=env).stdout)}
        if states == {"send_receipt": "succeeded", "leaky_task": "dead"}:
            break
        assert time.monotonic() < deadline and worker.poll() is None, states
        time.sleep(0.1)
    worker.send_signal(signal.SIGTERM)
    _out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0 and "Traceback" not in err, err
    dead = json.loads(cli("tasks", "--state", "dead", "--json", env=env).stdout)[0]["id"]
    assert "retrying leaky_task" in cli("tasks", "retry", str(dead), env=env).stdout
    assert "discarded leaky_task" in cli("tasks", "discard", str(dead), env=env).stdout
    cli("enqueue", "send_receipt", "--json", '{"order_id": 3}', env=env)
    waiting = json.loads(cli("tasks", "--state", "available", "--json", env=env).stdout)[0]["id"]
    assert "discarded send_receipt" in cli("tasks", "cancel", str(waiting), env=env).stdout
