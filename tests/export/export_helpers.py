"""Helpers for the export tests: a small registry and the `oncely export` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def oncely(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `oncely --app exportapp ...` in this directory (so the test app imports)."""
    return subprocess.run(
        [sys.executable, "-m", "oncely", "--app", "exportapp", *args],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ONCELY_APP": ""},
    )
