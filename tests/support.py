"""What tests of every feature share: waiting with a deadline, the CLI (in a real process or
in this one), background processes and their stop, and a database's contents.

Fixtures live in conftest.py files; plain functions many folders use live here, once:
`from tests.support import wait_until, run_cli`. A helper that one feature's tests share
stays in that feature's folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from click.testing import CliRunner
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
"""The repository: where `python -m oncely` finds `tests.apps.*`."""

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

T = TypeVar("T")

# -- waiting ----------------------------------------------------------------------------


def wait_until(
    check: Callable[[], T], what: str, *, deadline: float = 60.0, log: Path | None = None
) -> T:
    """Poll `check` every 20 ms until it returns something true, and return that; after
    `deadline` seconds fail, naming `what` (and quoting the end of `log`, if given)."""
    end = time.monotonic() + deadline
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > end:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"not within {deadline}s: {what}\n{tail}".rstrip())
        time.sleep(0.02)


# -- the CLI ----------------------------------------------------------------------------


EnvVars = Mapping[str, "str | None"]
"""Variables to set for a command, on top of this process's; None leaves one out."""


def environ(env: EnvVars | None) -> dict[str, str]:
    """This process's environment with `env` applied."""
    merged: dict[str, str | None] = {**os.environ, **(env or {})}
    return {k: v for k, v in merged.items() if v is not None}


def run_cli(
    *args: str, cwd: Path = ROOT, env: EnvVars | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m oncely ARGS` in a real process (this environment plus `env`), its output
    captured."""
    return subprocess.run(
        [sys.executable, "-m", "oncely", *args],
        cwd=cwd,
        env=environ(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_process(
    argv: list[str], *, cwd: Path = ROOT, env: EnvVars | None = None, log: Path | None = None
) -> subprocess.Popen[str]:
    """`argv` started in the background: its stdout and stderr together in `log`, or each
    piped (read them with `stop`)."""
    out: Any = log.open("w") if log is not None else subprocess.PIPE
    try:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=environ(env),
            text=True,
            stdout=out,
            stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
        )
    finally:
        if log is not None:
            out.close()  # the process writes to its own copy of the descriptor


def start_cli(
    *args: str, cwd: Path = ROOT, env: EnvVars | None = None, log: Path | None = None
) -> subprocess.Popen[str]:
    """`python -m oncely ARGS` started in the background (see `start_process`)."""
    return start_process([sys.executable, "-m", "oncely", *args], cwd=cwd, env=env, log=log)


def stop(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    """SIGTERM `proc` (if it still runs) and wait for it: its exit code and its stderr (empty
    when it went to a log)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err or ""


@dataclass
class Ran:
    """A command run in this process: its exit code and output."""

    returncode: int
    stdout: str
    stderr: str


def invoke_cli(*args: str, cwd: Path | None = None, env: EnvVars | None = None) -> Ran:
    """The CLI in this process (click's runner: the same code as `python -m oncely`, a faster
    start), stdout and stderr kept apart; an exception other than an exit is raised."""
    from oncely.cli import cli

    try:
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:  # click >= 8.2 always keeps them apart
        runner = CliRunner()
    saved = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = runner.invoke(cli, list(args), env=dict(env or {}), prog_name="oncely")
    finally:
        os.chdir(saved)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


RELIAB_APP = "tests.apps.reliab_app:app"


def cli_on(db_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`oncely ARGS` against the reliability app (tests/apps/reliab_app.py) and `db_url`, in
    its own process."""
    return run_cli(*args, env={"ONCELY_APP": RELIAB_APP, "ONCELY_DATABASE_URL": db_url, **env})


def one_clear_line(stderr: str) -> str:
    """The error line of a refused command: exactly one `error: …` line, no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


# -- a database's contents --------------------------------------------------------------


def engine_for(db_url: str) -> sa.Engine:
    """A plain synchronous engine on `db_url` (psycopg2 for Postgres), to read effects."""
    parsed = make_url(db_url)
    if parsed.get_backend_name() == "postgresql":
        return sa.create_engine(parsed.set(drivername="postgresql+psycopg2"))
    return sa.create_engine(parsed.set(drivername="sqlite"))


def drop_databases(admin_url: str, prefix: str) -> list[str]:
    """Drop every database named `prefix*` on the server of `admin_url` (what a benchmark's
    run made); the names found."""
    admin = engine_for(admin_url).execution_options(isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            names = conn.exec_driver_sql(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (f"{prefix}%",)
            )
            found = [row[0] for row in names]
            for name in found:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()
    return found


def run_bench(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python bench/SCRIPT ARGS…` from the project's root, its output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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
