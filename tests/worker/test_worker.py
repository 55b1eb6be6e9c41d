"""The worker end to end: real `oncely worker` processes, SIGKILL, SIGTERM, clock skew,
database outages; on SQLite and Postgres."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from tests import clusters
from tests.conftest import _reset_postgres
from tests.support import IN_CI, ROOT, run_cli, start_cli, wait_until
from tests.worker.proxy import Proxy

CONFORMANCE_SECONDS = float(os.environ.get("ONCELY_CONFORMANCE_SECONDS", "25"))
HAS_FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1").exists()


def conformance(db_url: str, *args: str, timeout: float = 300) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "bench/conformance.py", "--database-url", db_url, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.stdout, proc.stderr
    report: dict[str, object] = json.loads(proc.stdout)
    return report


@pytest.mark.slow
@pytest.mark.timeout(900)  # a conformance run of workers, SIGKILLs and a restart
def test_nothing_due_is_lost_and_nothing_runs_twice_under_kill9(db_url: str) -> None:
    """Guarantees 1 and 3: 4 workers running 3 every-second jobs (several due at once on one
    database: SQLite's single write lock), one worker SIGKILLed every 2-4 s; on Postgres, a
    cluster of the test's own, restarted once mid-run: every slot of the window has exactly
    one row."""
    args = ["--duration", str(CONFORMANCE_SECONDS), "--workers", "4", "--kill-min", "2"]
    args += ["--kill-max", "4", "--seed", "7", "--extra-jobs", "2"]
    with contextlib.ExitStack() as stack:
        if db_url.startswith("postgres"):
            if not clusters.available():
                message = "pg_createcluster (Debian's postgresql-common, as root) is needed"
                if IN_CI:
                    pytest.fail(message)
                pytest.skip(message)
            cluster = stack.enter_context(clusters.own_cluster())
            db_url = cluster.url
            args += ["--restart-postgres", f"{cluster.version}/{cluster.name}"]
        report = conformance(db_url, *args)
    assert report["missed"] == 0, report
    assert report["extra"] == 0, report
    assert report["claims"] == report["rows"], report  # work and claim committed together
    assert report["kills"] >= CONFORMANCE_SECONDS // 4, report
    assert report["exit_codes_on_sigterm"] == [0], report
    assert report["jobs"] == 3
    if report["database"] == "postgresql":
        assert report["postgres_restart_s"] is not None


@pytest.mark.skipif(not HAS_FAKETIME and not IN_CI, reason="libfaketime is not installed")
def test_clock_skew_makes_no_duplicate_and_no_extra_slot(db_url: str) -> None:
    """Workers whose clocks are 90 s ahead and 90 s behind, beside normal ones."""
    report = conformance(
        db_url,
        "--duration",
        "8",
        "--workers",
        "2",
        "--kill-max",
        "0",
        "--skew=+90s",
        "--skew=-90s",
    )
    assert (report["missed"], report["extra"]) == (0, 0), report
    if db_url.startswith("postgres"):
        # Slots come due by the database's clock: the fast worker runs nothing early.
        assert report["early"] == 0, report


# -- SIGTERM ---------------------------------------------------------------------------------


@pytest.fixture
def holder_env(db_url: str, sync_engine: sa.Engine, tmp_path: Path) -> dict[str, str]:
    env = {
        "ONCELY_DATABASE_URL": db_url,
        "ONCELY_APP": "tests.apps.holder:app",
        "ONCELY_TEST_SIGNALS": str(tmp_path),
    }
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    with sync_engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS held (slot varchar(64) NOT NULL)")
    return env


def start_worker(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[str]:
    return start_cli("worker", *args, env=env, log=log)


def held(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM held")).scalar_one())


def test_sigterm_lets_the_running_attempt_finish(
    holder_env: dict[str, str], sync_engine: sa.Engine, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    proc = start_worker(holder_env, log, "--shutdown-timeout", "30")
    wait_until(lambda: list(tmp_path.glob("started-*")), "the job to start")
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "worker.stopping" in log.read_text(), "the signal to be seen")
    assert proc.poll() is None  # still finishing the attempt
    (tmp_path / "release").touch()
    assert proc.wait(timeout=30) == 0
    text = log.read_text()
    assert "worker.shutdown: worker stopped" in text and "cancelled=0" in text, text
    assert held(sync_engine) == 1  # the attempt committed; no new slot was started
    assert text.count("run.ran:") == 1


def test_sigterm_cancels_an_attempt_past_the_shutdown_timeout(
    holder_env: dict[str, str], sync_engine: sa.Engine, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    proc = start_worker(holder_env, log, "--shutdown-timeout", "0.5")
    wait_until(lambda: list(tmp_path.glob("started-*")), "the job to start")
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    assert time.monotonic() - began < 15
    text = log.read_text()
    assert "cancelled=1" in text, text
    assert held(sync_engine) == 0  # rolled back
    with sync_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM oncely_runs")).scalar_one() == 0


# -- bad input ---------------------------------------------------------------------------------


def test_unknown_job_is_a_usage_error(holder_env: dict[str, str]) -> None:
    proc = run_cli("worker", "--jobs", "hold,nope", cwd=ROOT, env=holder_env)
    assert proc.returncode == 2
    assert "unknown job 'nope'" in proc.stderr and "hold" in proc.stderr


def test_missing_schema_is_a_usage_error(db_url: str) -> None:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_APP": "tests.apps.holder:app"}
    proc = run_cli("worker", cwd=ROOT, env=env)
    assert proc.returncode == 2
    assert "run `oncely migrate`" in proc.stderr


# -- the database goes away ------------------------------------------------------------------


@pytest.mark.postgres
def test_a_database_outage_is_retried_and_caught_up(postgres_database: str, tmp_path: Path) -> None:
    """Every connection dropped and new ones refused for ~3 s: the worker logs, retries with
    backoff, never dies, and catches up every slot (catch_up="all") once it is back."""
    _reset_postgres(postgres_database)
    real = make_url(postgres_database)
    proxy = Proxy(real.host or "127.0.0.1", real.port or 5432)
    proxy.restore()
    url = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    env = {"ONCELY_DATABASE_URL": url, "ONCELY_APP": "tests.apps.ticker:app"}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    engine = sa.create_engine(real.set(drivername="postgresql+psycopg2"))
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE ticks (job varchar(64), slot varchar(64), replica varchar(255), "
            "ran_at varchar(64))"
        )

    def slots() -> list[str]:
        with engine.connect() as conn:
            return [r[0] for r in conn.execute(sa.text("SELECT slot FROM ticks ORDER BY slot"))]

    log = tmp_path / "worker.log"
    proc = start_worker(env, log)
    try:
        wait_until(lambda: len(slots()) >= 2, "two slots before the outage")
        proxy.cut()
        wait_until(lambda: "worker.db_unavailable" in log.read_text(), "the outage", log=log)
        before = len(slots())
        cut_at = time.monotonic()
        wait_until(lambda: time.monotonic() - cut_at > 3, "3 s of outage")
        assert len(slots()) == before  # nothing got through
        assert proc.poll() is None
        proxy.restore()
        wait_until(lambda: "worker.db_reconnected" in log.read_text(), "the reconnect", log=log)
        wait_until(lambda: len(slots()) >= before + 5, "the catch-up", log=log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proxy.cut()
    got = slots()
    assert len(got) == len(set(got))
    times = [datetime.fromisoformat(s) for s in got]
    gaps = [b - a for a, b in itertools.pairwise(times) if b - a != timedelta(seconds=1)]
    assert gaps == [], log.read_text()
    engine.dispose()


def test_an_unreachable_database_at_start_is_waited_for_then_a_clear_error(
    tmp_path: Path,
) -> None:
    """Nothing listens on the port: after --startup-wait the worker exits 2, password masked."""
    proxy = Proxy("127.0.0.1", 9)  # never restored: connections are refused
    url = f"postgresql://oncely:s3cret@127.0.0.1:{proxy.port}/nowhere"
    env = {"ONCELY_DATABASE_URL": url, "ONCELY_APP": "tests.apps.holder:app"}
    began = time.monotonic()
    proc = run_cli("worker", "--startup-wait", "1.5", cwd=ROOT, env=env)
    assert proc.returncode == 2
    assert time.monotonic() - began >= 1.5
    assert "cannot reach the database" in proc.stderr and "worker.db_unavailable" in proc.stderr
    assert "s3cret" not in proc.stderr + proc.stdout and "***" in proc.stderr


@pytest.mark.postgres
def test_a_database_that_comes_up_after_the_worker_is_waited_for(
    postgres_database: str, tmp_path: Path
) -> None:
    _reset_postgres(postgres_database)
    real = make_url(postgres_database)
    proxy = Proxy(real.host or "127.0.0.1", real.port or 5432)
    proxy.restore()
    url = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    env = {"ONCELY_DATABASE_URL": url, "ONCELY_APP": "tests.apps.ticker:app"}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    engine = sa.create_engine(real.set(drivername="postgresql+psycopg2"))
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE ticks (job varchar(64), slot varchar(64), replica varchar(255), "
            "ran_at varchar(64))"
        )
    proxy.cut()
    log = tmp_path / "worker.log"
    proc = start_worker(env, log)
    try:
        wait_until(lambda: "worker.db_unavailable" in log.read_text(), "the wait", log=log)
        proxy.restore()
        wait_until(lambda: "run.ran:" in log.read_text(), "a run", log=log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proxy.cut()
        engine.dispose()


def test_the_worker_serves_metrics_built_from_its_events(
    tmp_path: Path, sync_engine: sa.Engine, db_url: str
) -> None:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_APP": "tests.apps.ticker:app"}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    with sync_engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE ticks (job varchar(64), slot varchar(64), replica varchar(255), "
            "ran_at varchar(64))"
        )
    port = Proxy("127.0.0.1", 9).port  # a free port
    log = tmp_path / "worker.log"
    proc = start_worker(env, log, "--metrics-port", str(port))
    try:
        wait_until(lambda: "run.ran:" in log.read_text(), "a run", log=log)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            text = page.read().decode()
        assert 'oncely_runs_total{job="tick",status="ran"}' in text
        assert 'oncely_fire_latency_seconds_count{job="tick"}' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
