"""A Postgres restart never kills a worker: two real `oncely worker` processes on a cluster of
the test's own, restarted with `-m immediate` (every backend killed, the server starting up
again); and a worker started while its cluster is down."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from tests import clusters
from tests.apps import mixed
from tests.support import IN_CI, ROOT, engine_for, run_cli, start_cli, wait_until

from oncely import Oncely

APP = "tests.apps.mixed:app"
OUTAGE_STARTS = "worker.db_unavailable:"
OUTAGE_ENDS = "worker.db_reconnected:"

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]


@pytest.fixture
def cluster() -> Iterator[clusters.Cluster]:
    if not clusters.available():
        message = "pg_createcluster (Debian's postgresql-common, as root) is needed"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    with clusters.own_cluster("oncely_restart") as made:
        yield made


def prepared(cluster: clusters.Cluster, tmp_path: Path) -> tuple[dict[str, str], sa.Engine]:
    """The mixed app's environment on `cluster`, migrated, with its tables."""
    env = {
        "ONCELY_DATABASE_URL": cluster.url,
        "ONCELY_APP": APP,
        "ONCELY_TEST_SIGNALS": str(tmp_path),
    }
    migrated = run_cli("migrate", cwd=ROOT, env=env)
    assert migrated.returncode == 0, migrated.stderr
    engine = engine_for(cluster.url)
    with engine.begin() as conn:
        for ddl in mixed.TABLES:
            conn.exec_driver_sql(ddl)
    return env, engine


async def enqueue(url: str, numbers: range) -> None:
    app = Oncely(url)
    async with AsyncSession(app.store.engine) as db, db.begin():
        await mixed.record.enqueue_many(db, [{"n": n} for n in numbers])
    await app.aclose()


def column(engine: sa.Engine, query: str) -> list[str]:
    """One column of `query`, or nothing while the server is not answering."""
    try:
        with engine.connect() as conn:
            return [str(row[0]) for row in conn.execute(sa.text(query))]
    except sa.exc.OperationalError:
        engine.dispose()
        return []


def count(log: Path, event: str) -> int:
    return len(re.findall(re.escape(event), log.read_text()))


def running(workers: list[subprocess.Popen[str]], logs: list[Path]) -> None:
    for proc, log in zip(workers, logs, strict=True):
        assert proc.poll() is None, f"a worker died (exit {proc.returncode}):\n{log.read_text()}"


def effects_reach(engine: sa.Engine, wanted: int, what: str, log: Path) -> None:
    wait_until(lambda: len(column(engine, "SELECT n FROM effects")) >= wanted, what, log=log)


def slots_go_on(engine: sa.Engine, what: str, log: Path) -> None:
    """Two more slots of the every-second job than now."""
    ticks = len(column(engine, "SELECT slot FROM ticks"))
    wait_until(lambda: len(column(engine, "SELECT slot FROM ticks")) >= ticks + 2, what, log=log)


def outage_ended(log: Path, times: int) -> None:
    wait_until(lambda: count(log, OUTAGE_ENDS) >= times, f"outage {times} ending", log=log)


def outages_ended(log: Path) -> None:
    """Every outage the worker logged has ended (a worker between two statements when the
    server restarts may not meet the restart at all)."""
    wait_until(
        lambda: count(log, OUTAGE_ENDS) == count(log, OUTAGE_STARTS), "the outage to end", log=log
    )


async def test_an_immediate_restart_twice_kills_no_worker_and_loses_nothing(
    cluster: clusters.Cluster, tmp_path: Path
) -> None:
    """Two workers running a job every second and tasks; the cluster restarted with
    `-m immediate` twice: both workers live on, slots and tasks continue after each restart
    (each effect once), each process logs each outage's start and end once, no traceback."""
    env, engine = prepared(cluster, tmp_path)
    logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
    workers = [start_cli("worker", "--concurrency", "4", env=env, log=log) for log in logs]
    wanted = 0
    try:
        for restart in (1, 2):
            await enqueue(cluster.url, range(wanted, wanted + 40))
            wanted += 40
            effects_reach(engine, wanted, f"the tasks before restart {restart}", logs[0])
            slots_go_on(engine, f"job slots before restart {restart}", logs[0])
            cluster.ctl("restart", "immediate")
            wait_until(lambda: column(engine, "SELECT 1"), f"the server after restart {restart}")
            slots_go_on(engine, f"job slots after restart {restart}", logs[0])
            for log in logs:  # a worker that met the outage says when it ended
                outages_ended(log)
            running(workers, logs)
        await enqueue(cluster.url, range(wanted, wanted + 40))
        wanted += 40
        effects_reach(engine, wanted, "the tasks after the restarts", logs[0])
        slots_go_on(engine, "job slots after the restarts", logs[0])
        running(workers, logs)
    finally:
        codes = []
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            codes.append(proc.wait(timeout=60))
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], texts
    effects = column(engine, "SELECT n FROM effects ORDER BY n")
    assert sorted(int(n) for n in effects) == list(range(wanted))  # each task's effect once
    slots = column(engine, "SELECT slot FROM ticks")
    assert len(slots) == len(set(slots))  # each slot at most once
    engine.dispose()
    for log, text in zip(logs, texts, strict=True):
        assert "Traceback" not in text, text
        assert count(log, OUTAGE_STARTS) <= 2, text  # once per outage, not per retry
        assert count(log, OUTAGE_ENDS) == count(log, OUTAGE_STARTS), text
    assert sum(count(log, OUTAGE_STARTS) for log in logs) >= 2, texts  # the restarts were met


def test_a_worker_started_while_the_cluster_is_down_waits_then_runs(
    cluster: clusters.Cluster, tmp_path: Path
) -> None:
    """The cluster stopped, a worker started (--startup-wait 120); then the server held
    starting up (57P03) past the seconds a worker used to give it; then it accepts
    connections: the worker said once that it waits, and runs slots and tasks."""
    env, engine = prepared(cluster, tmp_path)
    cluster.ctl("stop", "immediate")
    log = tmp_path / "worker.log"
    proc = start_cli("worker", "--startup-wait", "120", env=env, log=log)
    try:
        wait_until(lambda: OUTAGE_STARTS in log.read_text(), "the wait", log=log)
        assert "part=startup" in log.read_text()
        cluster.hold_starting_up()
        lasts(proc, log, 3.0)
        cluster.promote()
        wait_until(lambda: column(engine, "SELECT slot FROM ticks"), "a slot", log=log)
        outage_ended(log, 1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        engine.dispose()
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text, text
    assert count(log, OUTAGE_STARTS) == 1, text


async def test_a_server_held_starting_up_under_a_running_worker_is_waited_out(
    cluster: clusters.Cluster, tmp_path: Path
) -> None:
    """A running worker; the server stopped at once and held starting up (every connect
    refused with 57P03) for a while, then accepting connections: the worker lives on, said
    it once, and runs the slots and the tasks enqueued after."""
    env, engine = prepared(cluster, tmp_path)
    log = tmp_path / "worker.log"
    proc = start_cli("worker", "--concurrency", "4", env=env, log=log)
    try:
        await enqueue(cluster.url, range(20))
        effects_reach(engine, 20, "the tasks before", log)
        cluster.hold_starting_up()
        wait_until(lambda: OUTAGE_STARTS in log.read_text(), "the outage", log=log)
        lasts(proc, log, 3.0)
        cluster.promote()
        outage_ended(log, 1)
        await enqueue(cluster.url, range(20, 40))
        effects_reach(engine, 40, "the tasks after", log)
        slots_go_on(engine, "job slots after", log)
        assert proc.poll() is None, log.read_text()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    text = log.read_text()
    assert code == 0, text
    effects = column(engine, "SELECT n FROM effects")
    assert sorted(int(n) for n in effects) == list(range(40)), text  # each effect once
    engine.dispose()
    assert "Traceback" not in text, text
    assert count(log, OUTAGE_STARTS) == 1 and count(log, OUTAGE_ENDS) == 1, text


def lasts(proc: subprocess.Popen[str], log: Path, seconds: float) -> None:
    """The outage goes on for `seconds` (past the 2 s a worker used to give a server that is
    starting up), and the worker with it: it does not exit."""
    began = time.monotonic()
    wait_until(lambda: time.monotonic() - began > seconds or proc.poll() is not None, "time")
    assert proc.poll() is None, log.read_text()
