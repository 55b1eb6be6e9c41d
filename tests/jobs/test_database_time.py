"""On Postgres, time that decides what runs or is deleted is the database's, not the host's:
prune's cutoff, the due slot of `oncely run` without --now, and "now" for the future-slot
check of `oncely run --now`. The host's clock is moved with faketime (a real process whose
clock is hours or seconds off); the database's is the server's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from tests.conftest import _reset_postgres
from tests.support import IN_CI, cli_on, engine_for, one_clear_line, snapshot

from oncely import every
from oncely.schedule import default_key


def faketime_env(offset: str) -> dict[str, str]:
    """The environment that runs a process with its clock moved by `offset` (e.g. "+3h")."""
    library = next(
        (
            path
            for path in (
                "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
                "/usr/lib/faketime/libfaketime.so.1",
            )
            if os.path.exists(path)
        ),
        None,
    )
    if shutil.which("faketime") is None or library is None:
        if IN_CI:
            pytest.fail("faketime is not installed (.ci/run installs it)")
        pytest.skip("faketime is not installed")
    return {"LD_PRELOAD": library, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def db_now(db_url: str) -> datetime:
    engine = engine_for(db_url)
    with engine.connect() as conn:
        value = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    engine.dispose()
    assert isinstance(value, datetime)
    return value


@pytest.fixture
def pg(postgres_database: str) -> str:
    _reset_postgres(postgres_database)
    assert cli_on(postgres_database, "migrate").returncode == 0
    return postgres_database


def test_faketime_moves_the_host_clock() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **faketime_env("+3h")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert float(out.stdout) - datetime.now(timezone.utc).timestamp() > 3 * 3600 - 60


@pytest.mark.postgres
@pytest.mark.parametrize("offset", ["+3h", "-3h"])
def test_prune_cutoff_is_database_time(pg: str, offset: str) -> None:
    now = db_now(pg)
    engine = engine_for(pg)
    insert = sa.text(
        "INSERT INTO oncely_runs (job, key, scheduled_for, claimed_at, claimed_by) "
        "VALUES (:job, :key, :at, :at, 'test')"
    )
    with engine.begin() as conn:
        conn.execute(insert, {"job": "minutely", "key": "fresh", "at": now})
        conn.execute(insert, {"job": "minutely", "key": "old", "at": now - timedelta(hours=2)})
    done = cli_on(pg, "prune", "--older-than", "1h", **faketime_env(offset))
    assert done.returncode == 0, done.stderr
    with engine.connect() as conn:
        keys = [r[0] for r in conn.execute(sa.text("SELECT key FROM oncely_runs"))]
    engine.dispose()
    assert keys == ["fresh"], (offset, keys, done.stdout)


@pytest.mark.postgres
@pytest.mark.parametrize("offset", ["+90s", "-90s"])
def test_run_without_now_runs_the_slot_due_by_database_time(pg: str, offset: str) -> None:
    schedule = every(minutes=1)
    for _ in range(5):  # a run that straddles a minute boundary is repeated
        before = schedule.latest_at_or_before(db_now(pg))
        done = cli_on(pg, "run", "minutely", **faketime_env(offset))
        after = schedule.latest_at_or_before(db_now(pg))
        assert done.returncode == 0, done.stderr
        if before == after:
            break
        cli_on(pg, "release", "minutely", default_key(after))
        cli_on(pg, "release", "minutely", default_key(before))
    else:
        pytest.fail("every try straddled a minute boundary")
    assert before is not None
    engine = engine_for(pg)
    with engine.connect() as conn:
        keys = [r[0] for r in conn.execute(sa.text("SELECT key FROM oncely_runs"))]
    engine.dispose()
    assert keys == [default_key(before)], (offset, keys, done.stdout)


@pytest.mark.postgres
def test_a_host_ahead_cannot_run_a_future_slot_with_its_own_now(pg: str) -> None:
    # The host is 90 s ahead; `--now` from its clock names a slot the database has not reached.
    host_now = db_now(pg) + timedelta(seconds=90)
    slot = every(minutes=1).latest_at_or_before(host_now)
    assert slot is not None
    if slot <= db_now(pg) + timedelta(seconds=5):
        slot += timedelta(minutes=1)  # the minute turned in between: a slot still ahead
    before = snapshot(pg)
    done = cli_on(pg, "run", "minutely", "--now", slot.isoformat(), **faketime_env("+90s"))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "ahead of the database's clock" in one_clear_line(done.stderr)
    assert snapshot(pg) == before


def test_a_future_now_is_refused_unless_allowed(db_url: str) -> None:
    assert cli_on(db_url, "migrate").returncode == 0
    friday = (datetime.now(timezone.utc) + timedelta(days=3)).replace(
        hour=3, minute=0, second=0, microsecond=0
    )
    before = snapshot(db_url)
    done = cli_on(db_url, "run", "nightly", "--now", friday.isoformat())
    assert done.returncode == 2, (done.stdout, done.stderr)
    line = one_clear_line(done.stderr)
    assert "ahead of the database's clock" in line and "--allow-future" in line, line
    assert "skipped" in line
    assert snapshot(db_url) == before
    # Within the skew allowance (5 s) a --now is still the present.
    near = datetime.now(timezone.utc) + timedelta(seconds=2)
    assert cli_on(db_url, "run", "minutely", "--now", near.isoformat()).returncode == 0
    forced = cli_on(
        db_url,
        "--log-format",
        "json",
        "run",
        "nightly",
        "--now",
        friday.isoformat(),
        "--allow-future",
    )
    assert forced.returncode == 0, forced.stderr
    assert '"event": "run.future_allowed"' in forced.stderr
    assert '"level": "WARNING"' in forced.stderr
    assert "ran" in forced.stdout
