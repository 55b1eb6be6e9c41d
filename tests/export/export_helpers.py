"""Helpers for the export tests: run `oncely --app exportapp ...` in this directory."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from oncely.cli import cli

HERE = Path(__file__).resolve().parent


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def oncely(*args: str) -> Outcome:
    """The CLI in this process (fast): exit code, stdout and stderr kept apart."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(HERE)
        mp.delenv("ONCELY_APP", raising=False)
        try:
            runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]
        except TypeError:  # click >= 8.2 always keeps them apart
            runner = CliRunner()
        result = runner.invoke(cli, ["--app", "exportapp", *args], prog_name="oncely")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr)


def oncely_process(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m oncely --app exportapp ...` as a real process."""
    env = {k: v for k, v in os.environ.items() if k != "ONCELY_APP"}
    return subprocess.run(
        [sys.executable, "-m", "oncely", "--app", "exportapp", *args],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
