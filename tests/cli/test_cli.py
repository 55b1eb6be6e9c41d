"""The `oncely` command: outputs, JSON, and every bad input with its message and exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.apps.leaderboard import create_tables
from tests.support import ROOT, run_cli

APP = "tests.apps.leaderboard:app"


@pytest.fixture
def env(db_url: str, sync_engine: sa.Engine) -> dict[str, str]:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_APP": APP}
    migrated = run_cli("migrate", cwd=ROOT, env=env)
    assert migrated.returncode == 0 and "to version" in migrated.stdout
    create_tables(sync_engine)
    return env


def test_migrate_twice_says_up_to_date(env: dict[str, str]) -> None:
    again = run_cli("migrate", cwd=ROOT, env=env)
    assert again.returncode == 0 and "is up to date" in again.stdout


def test_next_prints_slot_times_only(env: dict[str, str]) -> None:
    out = run_cli(
        "next",
        "leaderboard_close",
        "-n",
        "3",
        "--after",
        "2026-11-27T18:00:00-06:00",
        cwd=ROOT,
        env=env,
    )
    assert out.returncode == 0
    assert out.stdout.splitlines() == [
        "2026-12-04T18:00:00-06:00",
        "2026-12-11T18:00:00-06:00",
        "2026-12-18T18:00:00-06:00",
    ]
    as_json = run_cli(
        "next", "leaderboard_close", "--after", "2026-11-28T00:00:00Z", "--json", cwd=ROOT, env=env
    )
    assert json.loads(as_json.stdout) == [
        {"slot": "2026-12-04T18:00:00-06:00", "key": "2026-12-05T00:00:00Z"}
    ]


def test_list_history_and_release(env: dict[str, str]) -> None:
    ran = run_cli(
        "run", "leaderboard_close", "--now", "2026-11-27T18:01:00-06:00", cwd=ROOT, env=env
    )
    assert ran.returncode == 0 and ran.stdout.startswith(
        "ran leaderboard_close slot 2026-11-27T18:00:00-06:00 key 2026-11-28T00:00:00Z in "
    )
    listed = json.loads(run_cli("list", "--json", cwd=ROOT, env=env).stdout)
    close = next(j for j in listed if j["name"] == "leaderboard_close")
    assert close["schedule"] == 'cron("0 18 * * FRI", tz="America/Mexico_City")'
    assert close["zone"] == "America/Mexico_City"
    assert close["next"].endswith("T18:00:00-06:00")
    assert close["last_run"]["slot"] == "2026-11-27T18:00:00-06:00"
    never = next(j for j in listed if j["name"] == "close_then_fail")
    assert never["last_run"] is None
    table = run_cli("list", cwd=ROOT, env=env).stdout
    assert table.splitlines()[0].split() == [
        "NAME",
        "SCHEDULE",
        "ZONE",
        "NEXT",
        "LAST",
        "RUN",
        "STATE",
    ]

    history = json.loads(
        run_cli("history", "leaderboard_close", "--json", cwd=ROOT, env=env).stdout
    )
    assert len(history) == 1
    assert history[0]["key"] == "2026-11-28T00:00:00Z"
    assert history[0]["claimed_by"].count(":") == 1
    assert history[0]["duration_ms"] is not None

    released = run_cli("release", "leaderboard_close", "2026-11-28T00:00:00Z", cwd=ROOT, env=env)
    assert released.returncode == 0 and released.stdout.startswith("released leaderboard_close")
    assert "run.released" in released.stderr
    assert json.loads(run_cli("history", "--json", cwd=ROOT, env=env).stdout) == []
    again = run_cli("release", "leaderboard_close", "2026-11-28T00:00:00Z", cwd=ROOT, env=env)
    assert again.returncode == 2 and "nothing released" in again.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "leaderbord_close"], "unknown job 'leaderbord_close' (known jobs: "),
        (["run", "leaderboard_close", "--now", "friday"], "bad --now 'friday': use ISO-8601"),
        (
            ["run", "leaderboard_close", "--now", "2026-11-27T18:00:00"],
            "bad --now '2026-11-27T18:00:00': it has no UTC offset",
        ),
        (["next", "nope"], "unknown job 'nope'"),
        (["next", "leaderboard_close", "--after", "yesterday"], "bad --after 'yesterday'"),
        (
            ["--app", "tests.apps.nosuchmodule:app", "list"],
            "bad --app 'tests.apps.nosuchmodule:app': no module named",
        ),
        (["--app", "tests.apps.leaderboard:nothing", "list"], "has no 'nothing'"),
        (["--app", "tests.apps.leaderboard:TOP3", "list"], "is a tuple, not an Oncely app"),
        (["--app", ":app", "list"], "bad --app ':app': use MODULE:ATTR"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    env: dict[str, str], args: list[str], message: str
) -> None:
    out = run_cli(*args, cwd=ROOT, env=env)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert out.stdout == ""
    # Nothing changed: no claim was written.
    assert json.loads(run_cli("history", "--json", cwd=ROOT, env=env).stdout) == []


def test_usage_errors_exit_2(env: dict[str, str]) -> None:
    out = run_cli("run", cwd=ROOT, env=env)
    assert out.returncode == 2 and "Missing argument 'JOB'" in out.stderr
    out = run_cli("next", "leaderboard_close", "-n", "0", cwd=ROOT, env=env)
    assert out.returncode == 2


def test_missing_schema_names_migrate(tmp_path: Path) -> None:
    env = {"ONCELY_DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.db'}", "ONCELY_APP": APP}
    for args in (["run", "leaderboard_close"], ["history"], ["list"]):
        out = run_cli(*args, cwd=ROOT, env=env)
        assert out.returncode == 2, (args, out.stderr)
        assert "run `oncely migrate`" in out.stderr


@pytest.mark.postgres
def test_unreachable_database_masks_the_password() -> None:
    url = "postgresql://payroll:s3cr3t-pw@127.0.0.1:1/payroll"
    for args in (["run", "leaderboard_close"], ["migrate"], ["history"]):
        out = run_cli(
            "--log-level", "debug", "--database-url", url, *args, cwd=ROOT, env={"ONCELY_APP": APP}
        )
        assert out.returncode == 2
        assert (
            "cannot reach the database at postgresql+asyncpg://payroll:***@127.0.0.1:1"
            in out.stderr
        )
        assert "s3cr3t-pw" not in out.stderr + out.stdout


def test_unreachable_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}"
    out = run_cli("--database-url", url, "migrate", cwd=ROOT)
    assert out.returncode == 2 and "cannot reach the database" in out.stderr


def test_unsupported_database_url() -> None:
    out = run_cli("--database-url", "mysql://root:hunter2@localhost/x", "migrate", cwd=ROOT)
    assert out.returncode == 2
    assert "unsupported database 'mysql'" in out.stderr and "hunter2" not in out.stderr


def test_python_dash_m_and_version() -> None:
    out = run_cli("--version", cwd=ROOT)
    assert out.returncode == 0 and "oncely" in out.stdout
