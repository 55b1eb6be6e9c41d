"""Log lines: stable events with fields, `--log-format json`, and never a password."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from tests.apps.leaderboard import create_tables
from tests.conftest import _reset_postgres
from tests.support import ROOT, run_cli

from oncely import events, logs

APP = "tests.apps.leaderboard:app"
FRIDAY = "2026-11-27T18:0{}:00-06:00"
PASSWORD = "s3cret-Pa55"


@pytest.fixture
def env(db_url: str, sync_engine: sa.Engine) -> dict[str, str]:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_APP": APP}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    create_tables(sync_engine)
    return env


def json_lines(stderr: str) -> list[dict[str, object]]:
    """Every stderr line, each of which must be one JSON object."""
    return [json.loads(line) for line in stderr.splitlines() if line.strip()]


def test_duplicates_are_observable_as_json_log_events(env: dict[str, str]) -> None:
    first = run_cli(
        "--log-format",
        "json",
        "run",
        "leaderboard_close",
        "--now",
        FRIDAY.format(0),
        cwd=ROOT,
        env=env,
    )
    second = run_cli(
        "--log-format",
        "json",
        "run",
        "leaderboard_close",
        "--now",
        FRIDAY.format(1),
        cwd=ROOT,
        env=env,
    )
    assert first.returncode == second.returncode == 0
    [ran] = [line for line in json_lines(first.stderr) if line.get("event") == "run.ran"]
    [skipped] = [line for line in json_lines(second.stderr) if line.get("event") == "run.skipped"]
    assert ran["level"] == "INFO" and ran["logger"] == "oncely" and ran["message"] == "ran"
    assert ran["job"] == skipped["job"] == "leaderboard_close"
    assert ran["key"] == skipped["key"] == "2026-11-28T00:00:00Z"
    assert isinstance(ran["duration_ms"], float)
    assert skipped["message"] == "already ran, skipping"
    assert skipped["claimed_by"] == ran["replica"]


def test_text_log_lines_name_the_event(env: dict[str, str]) -> None:
    run_cli("run", "leaderboard_close", "--now", FRIDAY.format(0), cwd=ROOT, env=env)
    again = run_cli("run", "leaderboard_close", "--now", FRIDAY.format(1), cwd=ROOT, env=env)
    [line] = [x for x in again.stderr.splitlines() if "run.skipped" in x]
    assert " INFO oncely run.skipped: already ran, skipping " in line
    assert "job=leaderboard_close key=2026-11-28T00:00:00Z" in line


@pytest.mark.postgres
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_bad_input_unreachable_database_never_shows_the_password(
    postgres_database: str, log_format: str, tmp_path: Path
) -> None:
    # The test server trusts local connections, so a URL with a password works: every
    # command below really talks to the database, at debug level.
    _reset_postgres(postgres_database)
    url = make_url(postgres_database).set(password=PASSWORD).render_as_string(False)
    down = make_url(url).set(port=1).render_as_string(False)
    base = ["--log-level", "debug", "--log-format", log_format, "--app", APP]
    outputs = [
        run_cli(*base, "--database-url", url, "migrate", cwd=ROOT),
        run_cli(*base, "--database-url", url, "run", "close_then_fail", cwd=ROOT),
        run_cli(*base, "--database-url", url, "list", cwd=ROOT),
        run_cli(*base, "--database-url", url, "history", cwd=ROOT),
        run_cli(*base, "--database-url", down, "run", "leaderboard_close", cwd=ROOT),
        run_cli(*base, "--database-url", down, "migrate", cwd=ROOT),
        run_cli(*base, "--database-url", down, "history", cwd=ROOT),
        run_cli(*base, "demo", "--database-url", down, cwd=tmp_path),
    ]
    assert [p.returncode for p in outputs] == [0, 1, 0, 0, 2, 2, 2, 2]
    for proc in outputs:
        assert PASSWORD not in proc.stdout + proc.stderr, proc.args
    assert "postgresql+asyncpg://postgres:***@" in outputs[0].stdout
    assert "cannot reach the database at postgresql+asyncpg://postgres:***@127.0.0.1:1/" in (
        outputs[4].stderr
    )
    if log_format == "json":
        # Every log line of a failed run is JSON, the traceback included; then comes the
        # run's summary (not a log line: the command's result, like `ran …` on stdout).
        lines = outputs[1].stderr.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("failed "))
        summary = lines[at]
        parsed = [json.loads(line) for line in lines[:at]]
        assert [p.get("event") for p in parsed] == ["run.failed", "run.traceback"]
        assert parsed[0]["job"] == "close_then_fail"
        assert "Traceback" in str(parsed[1]["exception"])
        assert summary.startswith("failed close_then_fail")


def test_formatters_mask_a_password_from_any_logger() -> None:
    stream = io.StringIO()
    logs.configure("debug", "json", stream)
    try:
        logging.getLogger("somelib").warning("connecting to postgresql://u:%s@db/x", PASSWORD)
        events.emit("run.failed", "boom", url=f"postgres://u:{PASSWORD}@db:5432/x", job="j")
        logs.configure("debug", "text", stream)
        logging.getLogger("oncely").debug("dsn=mysql+x://admin:%s@h/d", PASSWORD)
    finally:
        logs.configure("info", "text")
    text = stream.getvalue()
    assert PASSWORD not in text
    lines = text.splitlines()
    assert json.loads(lines[0])["message"] == "connecting to postgresql://u:***@db/x"
    assert json.loads(lines[1])["url"] == "postgres://u:***@db:5432/x"
    assert json.loads(lines[1])["event"] == "run.failed"
    assert lines[2].endswith("DEBUG oncely dsn=mysql+x://admin:***@h/d")


def test_debug_level_is_about_oncely_and_your_code_not_driver_chatter() -> None:
    stream = io.StringIO()
    logs.configure("debug", "text", stream)
    try:
        logging.getLogger("aiosqlite").debug("executing a statement")
        logging.getLogger("sqlalchemy.engine.Engine").info("SELECT 1")
        logging.getLogger("oncely").debug("an oncely detail")
        logging.getLogger("myapp.jobs").debug("a job's detail")
        logs.configure("info", "text", stream)
        logging.getLogger("myapp.jobs").info("paid 3 members")
        logging.getLogger("myapp.jobs").debug("hidden at info")
    finally:
        logs.configure("info", "text")
    text = stream.getvalue()
    assert "executing a statement" not in text and "SELECT 1" not in text
    assert "an oncely detail" in text and "a job's detail" in text
    assert "paid 3 members" in text and "hidden at info" not in text
