"""A database this oncely cannot use is refused with one clear line and exit 2, not retried:
a schema newer than this oncely, a SQLite schema changed by hand, a read-only SQLite file."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from tests.support import cli_on, engine_for, one_clear_line, snapshot

from oncely.store.migrations import BREAKING_STEP, COMPATIBLE_UP_TO, LATEST


def fake_newer_schema(db_url: str, *versions: int) -> None:
    """Record migrations that a later release applied (their steps are not run here)."""
    engine = engine_for(db_url)
    with engine.begin() as conn:
        for version in versions:
            conn.execute(
                sa.text("INSERT INTO oncely_schema (version, applied_at) VALUES (:v, :t)"),
                {"v": version, "t": "2026-12-01 00:00:00"},
            )
    engine.dispose()


def test_a_schema_from_a_breaking_migration_is_refused(db_url: str) -> None:
    assert cli_on(db_url, "migrate").returncode == 0
    breaking = COMPATIBLE_UP_TO + 1
    assert breaking % BREAKING_STEP == 0
    fake_newer_schema(db_url, LATEST + 1, breaking)
    before = snapshot(db_url)
    for args in (["migrate"], ["run", "minutely", "--now", "2026-12-01T10:00:00Z"], ["history"]):
        done = cli_on(db_url, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        line = one_clear_line(done.stderr)
        assert f"version {breaking}" in line and f"up to {COMPATIBLE_UP_TO}" in line, line
    assert snapshot(db_url) == before


def test_a_newer_additive_schema_still_runs(db_url: str) -> None:
    """Mid-rollout: the next release migrated (additive steps), this one restarts and runs."""
    assert cli_on(db_url, "migrate").returncode == 0
    fake_newer_schema(db_url, *range(LATEST + 1, COMPATIBLE_UP_TO + 1))
    migrated = cli_on(db_url, "migrate")
    assert migrated.returncode == 0 and "is up to date" in migrated.stdout, migrated.stderr
    ran = cli_on(db_url, "run", "minutely", "--now", "2026-12-01T10:00:00Z")
    assert ran.returncode == 0 and ran.stdout.startswith("ran minutely"), ran.stderr
    history = cli_on(db_url, "history", "--json")
    assert history.returncode == 0 and '"job": "minutely"' in history.stdout, history.stderr


def test_a_sqlite_schema_changed_by_hand_is_not_an_unreachable_database(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'app.db'}"
    assert cli_on(db_url, "migrate").returncode == 0
    engine = engine_for(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE oncely_runs DROP COLUMN claimed_by")
    engine.dispose()
    done = cli_on(db_url, "run", "minutely", "--now", "2026-12-01T10:00:00Z")
    assert done.returncode == 2, (done.stdout, done.stderr)
    line = one_clear_line(done.stderr)
    assert "cannot reach" not in line and "claimed_by" in line, line


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[str]:
    """The file made immutable (chattr +i) where the system allows it, else opened read-only."""
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(path)]).returncode == 0:
        try:
            yield f"sqlite:///{path}"
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        return
    yield f"sqlite:///file:{path}?mode=ro&uri=true"


def test_a_read_only_sqlite_file_is_exit_2_not_an_endless_outage(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    assert cli_on(f"sqlite:///{path}", "migrate").returncode == 0
    with read_only(path) as url:
        before = snapshot(url)
        run = cli_on(url, "run", "minutely", "--now", "2026-12-01T10:00:00Z")
        assert run.returncode == 2, (run.stdout, run.stderr)
        assert "read-only" in one_clear_line(run.stderr)
        # The worker gives up at start (within its timeout) instead of retrying forever.
        worker = cli_on(url, "worker", "--startup-wait", "1", "--concurrency", "0")
        assert worker.returncode == 2, (worker.stdout, worker.stderr[-2000:])
        assert "read-only" in worker.stderr and "Traceback" not in worker.stderr
        assert snapshot(url) == before
        assert cli_on(url, "history").returncode == 0  # reading still works
