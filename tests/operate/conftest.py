"""Shared by the control-plane tests: the operate app migrated on the test database, the CLI
in real processes, and the effects and records the tests count."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from tests.conftest import _reset_postgres
from tests.support import ROOT, Ran, engine_for, invoke_cli, run_cli, start_cli

APP = "tests.apps.operate_app:app"
TABLES = """
CREATE TABLE IF NOT EXISTS effects (job varchar(64) NOT NULL, slot varchar(64) NOT NULL,
                                    replica varchar(255) NOT NULL)
"""


def iso(value: Any) -> str:
    """A time read back with plain SQL (SQLite: naive UTC text) as ISO-8601 with its offset."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value).replace(tzinfo=timezone.utc)
    assert isinstance(value, datetime)
    return value.isoformat()


@dataclass
class Env:
    """One test's database, its environment for `oncely`, and a place for signal files."""

    db_url: str
    vars: dict[str, str]
    engine: sa.Engine
    tmp: Path

    def oncely(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """`oncely ARGS` in a process of its own."""
        return run_cli(*args, cwd=ROOT, env={**self.vars, **extra})

    def cli(self, *args: str) -> Ran:
        """`oncely ARGS` in this process (click's runner: the same code, a faster start)."""
        sys.modules.pop(APP.split(":")[0], None)  # a new process would import the app anew
        return invoke_cli("--app", APP, "--database-url", self.db_url, *args)

    def popen(self, *args: str, log: Path | None = None, **extra: str) -> subprocess.Popen[str]:
        """`oncely ARGS` started in the background (its output in `log`, or piped)."""
        return start_cli(*args, env={**self.vars, **extra}, log=log)

    def rows(self, query: str, **params: Any) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.text(query), params).all())

    def effects(self, job: str) -> list[str]:
        """The slots whose effects of `job` committed, in order."""
        return [r[0] for r in self.rows("SELECT slot FROM effects WHERE job = :j", j=job)]

    def audit(self) -> list[Any]:
        return self.rows("SELECT action, target, result, actor FROM oncely_audit ORDER BY id")

    def db_now(self) -> datetime:
        if self.db_url.startswith("postgres"):
            return self.rows("SELECT clock_timestamp()")[0][0]  # type: ignore[no-any-return]
        return datetime.now(timezone.utc)


def _env(db_url: str, tmp_path: Path) -> Env:
    engine = engine_for(db_url)
    vars = {"ONCELY_APP": APP, "ONCELY_DATABASE_URL": db_url}
    vars["ONCELY_TEST_HOLD"] = str(tmp_path / "release")
    e = Env(db_url, vars, engine, tmp_path)
    migrated = e.cli("migrate")
    assert migrated.returncode == 0, migrated.stderr
    with engine.begin() as conn:
        conn.exec_driver_sql(TABLES)
    return e


@pytest.fixture
def env(db_url: str, tmp_path: Path) -> Iterator[Env]:
    """The operate app on an empty test database (once SQLite, once Postgres)."""
    e = _env(db_url, tmp_path)
    yield e
    (tmp_path / "release").touch()
    e.engine.dispose()


@pytest.fixture
def pg_env(postgres_database: str, tmp_path: Path) -> Iterator[Env]:
    """The operate app on Postgres alone (what SQLite's single write lock cannot do)."""
    _reset_postgres(postgres_database)
    e = _env(postgres_database, tmp_path)
    yield e
    (tmp_path / "release").touch()
    e.engine.dispose()
