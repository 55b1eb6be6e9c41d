"""The pytest plugin as a user meets it: a separate pytest run over a user's test file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from tests.support import ROOT

USER_TESTS = """
import asyncio
from datetime import timedelta

import sqlalchemy as sa

from oncely import Oncely, clock
from oncely.testing import FakeProvider, FrozenClock


def test_the_database_is_ready_and_its_ledger_empty(oncely_db_url):
    async def go():
        app = Oncely(oncely_db_url)
        try:
            assert await app.history() == []
            async with app.effect("user:1") as db:
                assert db is not None
            async with app.effect("user:1") as db:
                assert db is None
        finally:
            await app.aclose()
    asyncio.run(go())
    print("URL", oncely_db_url.split("://")[0])


def test_again_starts_from_an_empty_ledger(oncely_db_url):
    test_the_database_is_ready_and_its_ledger_empty(oncely_db_url)


def test_fakes(fake_provider, frozen_clock):
    assert FakeProvider.from_env().path == fake_provider.path
    fake_provider.charge(1, idempotency_key="k")
    fake_provider.assert_applied(1)
    before = clock.utcnow()
    frozen_clock.advance(minutes=5)
    assert clock.utcnow() - before == timedelta(minutes=5)
"""


def _plugin_args() -> list[str]:
    """`-p` only while the entry point is not installed (a worktree); installed, it loads."""
    names = {ep.name for ep in entry_points(group="pytest11")}
    return [] if "oncely.testing.plugin" in names else ["-p", "oncely.testing.plugin"]


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    full_env = {**os.environ, **(env or {})}
    if env is None:
        full_env.pop("ONCELY_TEST_DB_URL", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            *_plugin_args(),
            *args,
        ],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout
    return proc.stdout


def test_plugin_defaults_to_a_temporary_sqlite_file(tmp_path: Path) -> None:
    out = _run(tmp_path)
    assert "URL sqlite" in out


@pytest.mark.postgres
def test_plugin_uses_postgres_from_the_option_or_the_environment(
    tmp_path: Path, postgres_database: str
) -> None:
    assert "URL postgresql" in _run(tmp_path, "--oncely-db-url", postgres_database)
    assert "URL postgresql" in _run(tmp_path, env={"ONCELY_TEST_DB_URL": postgres_database})


def test_the_entry_point_is_declared() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert (
        '[project.entry-points.pytest11]\n"oncely.testing.plugin" = "oncely.testing.plugin"' in text
    )
