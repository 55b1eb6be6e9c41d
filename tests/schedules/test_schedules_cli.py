"""`oncely schedules …`: each command on a real database, and every bad input the issue
lists is exit 2, one line, nothing changed."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result
from tests.schedules.conftest import APP, everything, migrate, rows

from oncely.cli import cli

TENANT = '{"tenant": "acme"}'


def invoke(db_url: str, *args: str) -> Result:
    sys.modules.pop(APP, None)  # a new process would import the app anew
    return CliRunner().invoke(cli, ["--app", f"{APP}:app", "--database-url", db_url, *args])


@pytest.fixture
def db(db_url: str) -> Iterator[str]:
    """The test database, migrated, with one schedule (`keep`) already there."""
    migrate(db_url)
    ok = invoke(db_url, "schedules", "add", "keep", "--every", "1h", "--job", "report")
    assert ok.exit_code == 0, ok.output
    yield db_url


def one_line_refusal(result: Result) -> str:
    output = result.stdout + result.stderr
    assert result.exit_code == 2, (result.exit_code, output, result.exception)
    assert "Traceback" not in output, output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error: ", "Error: "))]
    assert len(errors) == 1, result.stderr
    if errors[0].startswith("error: "):
        assert len(lines) == 1, result.stderr
    return errors[0]


ADD = ["schedules", "add", "new"]
BAD = {
    "bad cron": [*ADD, "--cron", "61 * * * *", "--task", "digest", "--args", TENANT],
    "unknown zone": [*ADD, "--cron", "0 9 * * *", "--tz", "Mars/Base", "--task", "digest"],
    "unknown task": [*ADD, "--every", "1h", "--task", "nope", "--args", TENANT],
    "unknown job": [*ADD, "--every", "1h", "--job", "nope"],
    "args that do not bind": [*ADD, "--every", "1h", "--task", "digest", "--args", '{"x": 1}'],
    "args not JSON": [*ADD, "--every", "1h", "--task", "digest", "--args", "{tenant: acme}"],
    "args not an object": [*ADD, "--every", "1h", "--task", "digest", "--args", "[1]"],
    "args NaN": [*ADD, "--every", "1h", "--task", "digest", "--args", '{"tenant": NaN}'],
    "duplicate name": ["schedules", "add", "keep", "--every", "1h", "--job", "report"],
    "a code job's name": ["schedules", "add", "nightly", "--every", "1h", "--job", "report"],
    "bad name": ["schedules", "add", "no spaces", "--every", "1h", "--job", "report"],
    "every 0s": [*ADD, "--every", "0s", "--task", "digest", "--args", TENANT],
    "every soon": [*ADD, "--every", "soon", "--task", "digest", "--args", TENANT],
    "every empty": [*ADD, "--every", "", "--task", "digest", "--args", TENANT],
    "cron and every": [*ADD, "--cron", "0 9 * * *", "--every", "1h", "--job", "report"],
    "neither cron nor every": [*ADD, "--job", "report"],
    "task and job": [*ADD, "--every", "1h", "--task", "digest", "--job", "report"],
    "no target": [*ADD, "--every", "1h"],
    "bad catch-up": [*ADD, "--every", "1h", "--job", "report", "--catch-up", "some"],
    "pause unknown": ["schedules", "pause", "nope"],
    "resume unknown": ["schedules", "resume", "nope"],
    "remove unknown": ["schedules", "remove", "nope"],
    "show unknown": ["schedules", "show", "nope"],
    "run unknown": ["schedules", "run", "nope"],
    "resume an active one": ["schedules", "resume", "keep"],
    "name not UTF-8": ["schedules", "show", "k\udcff"],
    "zone of 10,000 characters": [
        *ADD,
        "--cron",
        "0 9 * * *",
        "--tz",
        "A" * 10_000,
        "--job",
        "report",
    ],
    "a zone database file": [*ADD, "--every", "1h", "--tz", "posixrules", "--job", "report"],
    "args over 64 KiB": [
        *ADD,
        "--every",
        "1h",
        "--job",
        "report",
        "--args",
        json.dumps({"tenant": "x" * 65_536}),
    ],
    "a name under schedule:": [
        "schedules",
        "add",
        "schedule:keep",
        "--every",
        "1h",
        "--job",
        "report",
    ],
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_exit_2_one_line_and_changes_nothing(db: str, case: str) -> None:
    before = everything(db)
    line = one_line_refusal(invoke(db, *BAD[case]))
    assert line
    assert everything(db) == before


def test_add_list_show_pause_resume_remove(db: str) -> None:
    added = invoke(
        db, "schedules", "add", "acme", "--cron", "0 9 * * *", "--tz", "Europe/Madrid",
        "--task", "digest", "--args", TENANT, "--actor", "ops",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert "every day at 09:00 (Europe/Madrid)" in added.stdout
    listed = json.loads(invoke(db, "schedules", "list", "--json").stdout)
    assert [(s["name"], s["state"]) for s in listed] == [("acme", "active"), ("keep", "active")]
    paused = invoke(db, "schedules", "pause", "acme", "--reason", "left", "--actor", "ops")
    assert paused.exit_code == 0, paused.output
    shown = json.loads(invoke(db, "schedules", "show", "acme", "--json").stdout)
    assert (shown["state"], shown["pause_reason"], shown["ledger_name"]) == (
        "paused",
        "left",
        "schedule:acme",
    )
    explained = invoke(db, "explain", "acme")
    assert explained.exit_code == 0, explained.output
    assert "paused" in explained.stdout.splitlines()[0], explained.stdout
    assert invoke(db, "schedules", "resume", "acme").exit_code == 0
    removed = invoke(db, "schedules", "remove", "acme")
    assert removed.exit_code == 0, removed.output
    listed = json.loads(invoke(db, "schedules", "list", "--json").stdout)
    assert [s["name"] for s in listed] == ["keep"]
    actions = rows(db, "SELECT action FROM oncely_audit WHERE job = 'schedule:acme' ORDER BY id")
    assert [a for (a,) in actions] == ["add", "pause", "resume", "remove"]


def test_history_shows_a_schedules_slots_under_its_name(db: str) -> None:
    engine_rows = rows(db, "SELECT 1")
    assert engine_rows == [(1,)]
    ran = invoke(db, "schedules", "run", "keep")
    # `keep` was added within the hour: its latest slot came before it, nothing ran.
    assert ran.exit_code == 2 and "no slot" in ran.stderr
    ok = invoke(
        db, "schedules", "add", "fast", "--every", "1s", "--task", "digest", "--args", TENANT
    )
    assert ok.exit_code == 0, ok.output
    wait = rows(db, "SELECT next_slot FROM oncely_schedules WHERE name = 'fast'")
    assert wait
    for _ in range(200):  # the first slot after the add comes due within a second
        ran = invoke(db, "schedules", "run", "fast")
        if ran.exit_code == 0:
            break
    assert ran.exit_code == 0, ran.output
    history = json.loads(invoke(db, "history", "fast", "--json").stdout)
    assert [h["job"] for h in history] == ["schedule:fast"]
    assert "fast" in history[0]["job"]
    by_ledger = json.loads(invoke(db, "history", "schedule:fast", "--json").stdout)
    assert by_ledger == history
