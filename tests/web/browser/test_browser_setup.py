"""Without Chromium the browser tests skip on a developer's machine and fail under CI=true
(a nested pytest run with the browser's path pointed at nothing)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests.support import ROOT

TEST = "tests/web/browser/test_browser_dashboard.py::test_overview_lists_every_job_and_its_pause"


def nested(ci: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CI": ci, "ONCELY_TEST_CHROMIUM": "/nonexistent/chromium"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", f"{TEST}[sqlite]", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(280)  # two nested pytest runs
def test_missing_chromium_fails_under_ci_and_skips_elsewhere() -> None:
    in_ci = nested("true")
    assert in_ci.returncode == 1, in_ci.stdout[-2000:]
    assert "no Chromium at /nonexistent/chromium" in in_ci.stdout
    assert "1 error" in in_ci.stdout, in_ci.stdout[-2000:]
    elsewhere = nested("")
    assert elsewhere.returncode == 0, elsewhere.stdout[-2000:]
    assert "1 skipped" in elsewhere.stdout, elsewhere.stdout[-2000:]
