"""Shared by the reliability tests: the CLI in a real process, and the database's contents."""

from __future__ import annotations

import subprocess
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from tests.conftest import ROOT, run_cli

APP = "tests.apps.reliab_app:app"


def oncely(db_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`oncely ARGS` against the test app and database, in its own process."""
    return run_cli(*args, cwd=ROOT, env={"ONCELY_APP": APP, "ONCELY_DATABASE_URL": db_url, **env})


def engine_for(db_url: str) -> sa.Engine:
    parsed = make_url(db_url)
    if parsed.get_backend_name() == "postgresql":
        return sa.create_engine(parsed.set(drivername="postgresql+psycopg2"))
    return sa.create_engine(parsed.set(drivername="sqlite"))


TABLES = (
    "oncely_runs",
    "oncely_tasks",
    "oncely_schema",
    "oncely_attempts",
    "oncely_pauses",
    "oncely_audit",
    "oncely_task_cancels",
    "oncely_duplicates",
    "oncely_task_errors",
)


def snapshot(db_url: str) -> dict[str, list[Any]]:
    """Every row of oncely's tables (those that exist), to check that nothing changed."""
    engine = engine_for(db_url)
    try:
        with engine.connect() as conn:
            names = set(sa.inspect(conn).get_table_names())
            return {
                table: sorted(
                    (
                        tuple(map(str, row))
                        for row in conn.exec_driver_sql(f"SELECT * FROM {table}")
                    ),
                )
                for table in TABLES
                if table in names
            }
    finally:
        engine.dispose()


def one_clear_line(stderr: str) -> str:
    """The error line of a refused command: exactly one `error: …` line, no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]
