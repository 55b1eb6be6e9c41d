"""`oncely --version` and `--help` start fast: they import neither SQLAlchemy nor asyncio
nor the runner (a cron, EventBridge or Kubernetes `oncely run` pays its imports on every
slot; these two pay only click's). Checked by the modules imported, not by timing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.support import ROOT

HEAVY = ("sqlalchemy", "asyncio", "oncely.app", "oncely.runner", "oncely.store", "oncely.registry")

PROBE = """
import json, sys
from oncely.cli import cli
try:
    cli(ARGS, prog_name="oncely")
except SystemExit:
    pass
json.dump(sorted(sys.modules), sys.stderr)
"""


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["run", "--help"], ["tasks", "-h"]])
def test_version_and_help_import_nothing_heavy(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.replace("ARGS", repr(args))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip(), done.stderr
    modules = json.loads(done.stderr)
    loaded = [m for m in modules if m.startswith(HEAVY)]
    assert not loaded, loaded


def test_the_public_api_is_still_there_on_first_use() -> None:
    code = (
        "import sys, oncely; assert 'sqlalchemy' not in sys.modules; "
        "from oncely import Oncely, cron, RetryPolicy, claim_run, __all__; "
        "assert all(getattr(oncely, name) is not None for name in __all__); "
        "print(Oncely.__module__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "oncely.app", done.stderr
