"""Export does what it can: refused jobs are skipped with a warning naming each (exit 0),
`--strict` refuses the whole export (exit 2, nothing written), and the default output runs
from a fresh shell (the program's full path, the working directory)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from export_helpers import HERE, IN_CI, oncely
from exportapp import DST, JOBS, NOWHERE, SPECIAL

ALL = {**JOBS, **SPECIAL, **NOWHERE, **DST}
ARGS = [
    "--cluster=arn:aws:ecs:us-east-1:123456789012:cluster/jobs",
    "--task-definition=arn:aws:ecs:us-east-1:123456789012:task-definition/app:7",
    "--container=app",
    "--role-arn=arn:aws:iam::123456789012:role/oncely-scheduler",
]
# What each target cannot say (see docs/export.md's table).
REFUSED = {
    "eventbridge": {"fifth_or_monday", "every_seven_minutes"},
    "kubernetes": {"month_end", "second_tuesday", "every_seven_minutes"},
    "crontab": {"month_end", "second_tuesday", "every_seven_minutes"},
    "systemd": {"every_seven_minutes"},
}
TARGET_ARGS = {
    "eventbridge": ARGS,
    "kubernetes": ["--image", "app:1"],
    "crontab": [],
    "systemd": [],
}


def _skipped(stderr: str) -> set[str]:
    return {
        line.split("'")[1]
        for line in stderr.splitlines()
        if line.startswith("warning: skipped job")
    }


@pytest.mark.parametrize("target", sorted(REFUSED))
def test_the_others_are_exported_and_each_refusal_is_a_warning(target: str) -> None:
    result = oncely("export", target, "--format", "json", *TARGET_ARGS[target])
    assert result.returncode == 0, result.stderr
    assert _skipped(result.stderr) == REFUSED[target]
    assert "--job NAME" in result.stderr and "--strict" in result.stderr
    exported = set(ALL) - REFUSED[target]
    for name in exported:
        assert name in result.stdout, name
    for name in REFUSED[target]:
        assert f"run {name}" not in result.stdout and f'"{name}"' not in result.stdout


@pytest.mark.parametrize("target", sorted(REFUSED))
def test_strict_refuses_everything_and_names_each_job(target: str, tmp_path: Path) -> None:
    extra = ["--output-dir", str(tmp_path / "units")] if target == "systemd" else []
    result = oncely("export", target, "--strict", *TARGET_ARGS[target], *extra)
    assert result.returncode == 2 and result.stdout == ""
    assert "nothing written" in result.stderr and "--job NAME" in result.stderr
    for name in REFUSED[target]:
        assert f"job {name!r}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "units").exists()


def test_unknown_job_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "units"
    result = oncely("export", "systemd", "--job", "nope", "--output-dir", str(out))
    assert result.returncode == 2 and "unknown job 'nope'" in result.stderr
    assert not out.exists()


def test_partial_outputs_pass_the_real_validators(tmp_path: Path) -> None:
    if shutil.which("kubernetes-validate") is None or shutil.which("cfn-lint") is None:
        pytest.fail("kubernetes-validate / cfn-lint are missing: pip install -e '.[test]'")
    k8s = oncely("export", "kubernetes", "--image", "app:1")
    assert k8s.returncode == 0, k8s.stderr
    assert k8s.stdout.count("kind: CronJob") == len(ALL) - len(REFUSED["kubernetes"])
    (tmp_path / "cronjobs.yaml").write_text(k8s.stdout)
    check = subprocess.run(
        ["kubernetes-validate", "--strict", "--quiet", str(tmp_path / "cronjobs.yaml")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    aws = oncely("export", "eventbridge", *ARGS)
    assert aws.returncode == 0, aws.stderr
    assert aws.stdout.count("AWS::Scheduler::Schedule") == len(ALL) - len(REFUSED["eventbridge"])
    (tmp_path / "schedules.yaml").write_text(aws.stdout)
    lint = subprocess.run(
        ["cfn-lint", str(tmp_path / "schedules.yaml")], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(ANALYZE is None and not IN_CI, reason="systemd-analyze is not installed")
def test_default_systemd_units_name_the_full_program_and_directory(tmp_path: Path) -> None:
    assert ANALYZE is not None, "systemd-analyze is missing (CI installs the systemd package)"
    out = tmp_path / "units"
    result = oncely("export", "systemd", "--output-dir", str(out))
    assert result.returncode == 0, result.stderr
    service = (out / "oncely-leaderboard_close.service").read_text()
    program = Path(sys.executable).parent / "oncely"
    assert f"WorkingDirectory={HERE}\n" in service
    assert f"ExecStart={program} --app exportapp run leaderboard_close\n" in service
    verify = subprocess.run(
        [ANALYZE, "verify", str(out / "oncely-leaderboard_close.service")],
        capture_output=True,
        text=True,
    )  # verify also checks that ExecStart's program exists
    problems = [line for line in verify.stderr.splitlines() if "oncely-leaderboard" in line]
    assert not problems, verify.stderr


def test_default_crontab_line_runs_from_a_fresh_shell(tmp_path: Path) -> None:
    """Cron starts each line with `sh -c`, PATH=/usr/bin:/bin, in $HOME: the line must work."""
    result = oncely("export", "crontab", "--job", "leaderboard_close")
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if x.endswith("run leaderboard_close")]
    command = line.split(" ", 5)[5]
    assert command.startswith("cd ")
    url = f"sqlite:///{tmp_path / 'cron.db'}"
    cron_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SHELL": "/bin/sh"}
    cron_env["ONCELY_DATABASE_URL"] = url  # set in the crontab, above the lines
    if os.environ.get("PYTHONPATH"):
        cron_env["PYTHONPATH"] = os.environ["PYTHONPATH"]  # the oncely under test
    migrate = command.replace(" run leaderboard_close", " migrate")
    for cmd in (migrate, command):
        done = subprocess.run(
            ["/bin/sh", "-c", cmd], cwd=tmp_path, env=cron_env, capture_output=True, text=True
        )
        assert done.returncode == 0, (cmd, done.stdout, done.stderr)
    assert done.stdout.startswith("ran leaderboard_close slot ")
    assert shlex.split(command)[1] == str(HERE)
