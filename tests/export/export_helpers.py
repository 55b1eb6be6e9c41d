"""Helpers for the export tests: run `oncely --app exportapp ...` in this directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import IN_CI, Ran, invoke_cli, run_cli

__all__ = ["HERE", "IN_CI", "oncely", "oncely_process"]

HERE = Path(__file__).resolve().parent
NO_APP = {"ONCELY_APP": None}
"""The environment's app, if any, left out: `--app exportapp` is the one used."""


def oncely(*args: str) -> Ran:
    """The CLI in this process (fast): exit code, stdout and stderr kept apart."""
    return invoke_cli("--app", "exportapp", *args, cwd=HERE, env=NO_APP)


def oncely_process(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m oncely --app exportapp ...` as a real process."""
    return run_cli("--app", "exportapp", *args, cwd=HERE, env=NO_APP, timeout=120)
