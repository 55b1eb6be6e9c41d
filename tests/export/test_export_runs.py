"""The exported commands run: what EventBridge and a CronJob start claims one slot, once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from export_helpers import HERE, oncely

ARGS = [
    "--cluster=arn:aws:ecs:us-east-1:123456789012:cluster/jobs",
    "--task-definition=arn:aws:ecs:us-east-1:123456789012:task-definition/app:7",
    "--container=app",
    "--role-arn=arn:aws:iam::123456789012:role/oncely-scheduler",
]


def _run(argv: list[str], db_url: str) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "oncely"
    env = {k: v for k, v in os.environ.items() if k != "ONCELY_APP"}
    env["ONCELY_DATABASE_URL"] = db_url
    return subprocess.run(
        [sys.executable, "-m", "oncely", *argv[1:]],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_eventbridge_command_with_the_scheduled_time_runs_that_slot_once(db_url: str) -> None:
    exported = oncely("export", "eventbridge", "--format", "json", *ARGS, "--job", "quarter_hours")
    assert exported.returncode == 0, exported.stderr
    target = json.loads(exported.stdout)["schedules"][0]["Target"]
    argv = json.loads(target["Input"])["containerOverrides"][0]["command"]
    migrate = _run(["oncely", "--app", "exportapp", "migrate"], db_url)
    assert migrate.returncode == 0, migrate.stderr
    # EventBridge substitutes the slot's scheduled time; a retry gets the same one, and a
    # late start (here: the slot is long past) still maps to that slot.
    scheduled = [a.replace("<aws.scheduler.scheduled-time>", "2026-02-01T09:15:00Z") for a in argv]
    first, retry = _run(scheduled, db_url), _run(scheduled, db_url)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("ran quarter_hours slot 2026-02-01T09:15:00+00:00 ")
    assert retry.returncode == 0, retry.stderr
    assert retry.stdout.startswith("skipped quarter_hours slot 2026-02-01T09:15:00+00:00 ")
    history = _run(["oncely", "--app", "exportapp", "history", "quarter_hours", "--json"], db_url)
    claims = json.loads(history.stdout)
    assert [c["key"] for c in claims] == ["2026-02-01T09:15:00Z"]


def test_cronjob_command_runs_the_latest_due_slot_once(db_url: str) -> None:
    exported = oncely("export", "kubernetes", "--format", "json", "--image", "app:1",
                      "--job", "leaderboard_close")  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    spec = json.loads(exported.stdout)["items"][0]["spec"]["jobTemplate"]["spec"]["template"]
    argv = spec["spec"]["containers"][0]["command"]
    assert argv == ["oncely", "--app", "exportapp", "run", "leaderboard_close"]
    assert _run(["oncely", "--app", "exportapp", "migrate"], db_url).returncode == 0
    # Two pods for one schedule time (a duplicate Job, a backoff retry): both compute the
    # latest due Friday 18:00 slot from their start time; the claim lets one run it.
    first, second = _run(argv, db_url), _run(argv, db_url)
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert first.stdout.startswith("ran leaderboard_close slot ")
    assert second.stdout.startswith("skipped leaderboard_close slot ")
    assert first.stdout.split()[3] == second.stdout.split()[3]  # the same slot


def test_yaml_export_without_pyyaml_says_so_and_json_still_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PyYAML is the `export` extra: without it a YAML export is one line and exit 2, with
    nothing on stdout; the same export as JSON needs nothing more."""
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` raises ImportError
    yaml_out = oncely("export", "kubernetes", "--image", "app:1", "--job", "every_two_hours")
    assert yaml_out.returncode == 2
    assert yaml_out.stdout == ""
    assert "export` extra" in yaml_out.stderr and "--format json" in yaml_out.stderr
    assert "Traceback" not in yaml_out.stderr
    as_json = oncely(
        "export", "kubernetes", "--image", "app:1", "--job", "every_two_hours", "--format", "json"
    )
    assert as_json.returncode == 0, as_json.stderr
    assert [item["kind"] for item in json.loads(as_json.stdout)["items"]] == ["CronJob"]
