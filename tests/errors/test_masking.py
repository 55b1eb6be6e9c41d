"""No credential in what `oncely` prints: a job's or a task's error that names a database
(URL userinfo, `?password=`, a libpq DSN) is masked in every text and JSON output, and the
query's other parameters stay readable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from tests.support import ROOT, run_cli

SECRETS = ("S3cr3tPw", "S3c&", "Dsn5ecret")
SLOT = "2026-11-27T05:00:00+01:00"
NEXT_DAY = "2026-11-28T05:00:00+01:00"  # another slot: the first, failed, is given up


@pytest.fixture
def env(db_url: str, tmp_path: Path) -> dict[str, str]:
    url = make_url(db_url)
    driver = "postgresql+asyncpg" if url.get_backend_name() == "postgresql" else "sqlite+aiosqlite"
    env = {
        "ONCELY_APP": "tests.apps.user_engine:jobs",
        "ONCELY_TEST_ENGINE_URL": url.set(drivername=driver).render_as_string(False),
        "ONCELY_TEST_SIGNALS": str(tmp_path),
    }
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    return env


def shown(*args: str, env: dict[str, str], code: int = 0) -> str:
    out = run_cli(*args, cwd=ROOT, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == code, (args, text)
    assert not [s for s in SECRETS if s in text], (args, text)
    return text


def test_a_jobs_error_is_masked_everywhere(env: dict[str, str]) -> None:
    ran = shown("run", "leak", "--now", SLOT, env=env, code=1)
    assert "failed leak" in ran and "?password=***&retQ=1" in ran and "password=***" in ran
    as_json = shown("run", "leak", "--now", NEXT_DAY, "--json", env=env, code=1)
    assert "?password=***&retQ=1" in as_json
    assert "retQ=1" in shown("explain", "leak", "--slot", SLOT, env=env)
    explained = json.loads(shown("explain", "leak", "--slot", SLOT, "--json", env=env))
    assert "app:***@db.internal" in explained["attempts"][0]["error"]


def test_a_tasks_error_is_masked_everywhere(env: dict[str, str]) -> None:
    shown("enqueue", "leaky_task", env=env)
    worker = subprocess.Popen(
        [sys.executable, "-m", "oncely", "worker"],
        cwd=ROOT,
        env={**os.environ, **env},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while json.loads(shown("tasks", "--json", env=env))[0]["state"] != "dead":
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert not [s for s in SECRETS if s in err], err
    assert "app:***@db.internal" in shown("tasks", env=env)  # LAST ERROR
    assert "retQ=1" in json.loads(shown("tasks", "--json", env=env))[0]["error"]
    assert "password=***" in shown("tasks", "show", "1", env=env)
    detail = json.loads(shown("tasks", "show", "1", "--json", env=env))
    assert "password=***" in detail["error"] and "password=***" in str(detail["attempt_errors"])
    assert "app:***@" in shown("tasks", "explain", "1", env=env)
    assert "app:***@" in shown("tasks", "explain", "1", "--json", env=env)


@pytest.mark.parametrize(
    "dsn", ["host=db password=Dsn5ecret dbname=x", "host=db password='Dsn5ecret' dbname=x"]
)
def test_a_libpq_dsn_as_database_url_is_masked(dsn: str) -> None:
    text = shown("--database-url", dsn, "migrate", env={"ONCELY_APP": ""}, code=2)
    assert "error:" in text and "password=***" in text and "Traceback" not in text
