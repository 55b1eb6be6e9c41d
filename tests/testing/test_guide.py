"""docs/testing.md runs as written: its file blocks are copied into a directory and a
separate pytest runs them there, through the plugin, on SQLite and on Postgres."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from tests.support import ROOT

# Each test runs a whole pytest of its own (300 s at most).
pytestmark = pytest.mark.timeout(600)

GUIDE = ROOT / "docs" / "testing.md"
BLOCK = re.compile(r"<!-- file: (?P<name>[\w.]+) -->\n```\w*\n(?P<code>.*?)```", re.S)


def _write_guide(directory: Path) -> list[str]:
    names = []
    for match in BLOCK.finditer(GUIDE.read_text()):
        (directory / match["name"]).write_text(match["code"])
        names.append(match["name"])
    return names


def _run_guide(tmp_path: Path, *args: str, write: bool = True) -> subprocess.CompletedProcess[str]:
    if write:
        names = _write_guide(tmp_path)
        assert {
            "orders.py",
            "conftest.py",
            "test_article.py",
            "test_once.py",
            "test_task.py",
            "test_engine_app.py",
        } <= set(names)
    plugin = (
        []
        if "oncely.testing.plugin" in {ep.name for ep in entry_points(group="pytest11")}
        else ["-p", "oncely.testing.plugin"]
    )
    env = {k: v for k, v in os.environ.items() if k != "ONCELY_TEST_DB_URL"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_guide_passes_on_sqlite(tmp_path: Path) -> None:
    proc = _run_guide(tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\b13 passed\b", proc.stdout), proc.stdout[-2000:]


@pytest.mark.postgres
def test_the_guide_passes_on_postgres(tmp_path: Path, postgres_database: str) -> None:
    proc = _run_guide(tmp_path, "--oncely-db-url", postgres_database)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\b13 passed\b", proc.stdout), proc.stdout[-2000:]


def test_the_guide_fails_with_a_handler_that_is_not_idempotent(tmp_path: Path) -> None:
    """The guide's tests can fail: drop the idempotency key and the crash test must fail."""
    _write_guide(tmp_path)
    orders = tmp_path / "orders.py"
    text = orders.read_text()
    broken = text.replace(
        'idempotency_key=idempotency_key("charge", order_id)', "idempotency_key=None"
    )
    assert broken != text
    orders.write_text(broken)
    proc = _run_guide(tmp_path, "-k", "crash", write=False)
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "2 effects landed" in proc.stdout
    assert "assert 2 == 1" in proc.stdout  # the article's own crash test fails too
    assert "FAILED test_task.py::test_charge_task_recovers_after_crash" in proc.stdout
