"""A database this oncely cannot use is refused with one clear line and exit 2, not retried:
a schema newer than this oncely, a SQLite schema changed by hand, a read-only SQLite file."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from tests.reliability.helpers import engine_for, oncely, one_clear_line, snapshot

from oncely.store.migrations import LATEST


def test_a_schema_newer_than_this_oncely_is_refused(db_url: str) -> None:
    assert oncely(db_url, "migrate").returncode == 0
    engine = engine_for(db_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO oncely_schema (version, applied_at) VALUES (:v, :t)"),
            {"v": LATEST + 1, "t": "2026-12-01 00:00:00"},
        )
    engine.dispose()
    before = snapshot(db_url)
    for args in (["migrate"], ["run", "minutely", "--now", "2026-12-01T10:00:00Z"], ["history"]):
        done = oncely(db_url, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        line = one_clear_line(done.stderr)
        assert f"version {LATEST + 1}" in line and f"up to {LATEST}" in line, line
    assert snapshot(db_url) == before


def test_a_sqlite_schema_changed_by_hand_is_not_an_unreachable_database(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'app.db'}"
    assert oncely(db_url, "migrate").returncode == 0
    engine = engine_for(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE oncely_runs DROP COLUMN claimed_by")
    engine.dispose()
    done = oncely(db_url, "run", "minutely", "--now", "2026-12-01T10:00:00Z")
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
    assert oncely(f"sqlite:///{path}", "migrate").returncode == 0
    with read_only(path) as url:
        before = snapshot(url)
        run = oncely(url, "run", "minutely", "--now", "2026-12-01T10:00:00Z")
        assert run.returncode == 2, (run.stdout, run.stderr)
        assert "read-only" in one_clear_line(run.stderr)
        # The worker gives up at start (within its timeout) instead of retrying forever.
        worker = oncely(url, "worker", "--startup-wait", "1", "--concurrency", "0")
        assert worker.returncode == 2, (worker.stdout, worker.stderr[-2000:])
        assert "read-only" in worker.stderr and "Traceback" not in worker.stderr
        assert snapshot(url) == before
        assert oncely(url, "history").returncode == 0  # reading still works
