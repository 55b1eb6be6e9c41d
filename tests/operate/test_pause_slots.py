"""A pause covers exactly the slots whose time lies inside it (guarantee 10), with real worker
processes and an every-second job with catch_up="all" (`tick`): the slots before the pause
and after the resume run once each, those inside none; a resume whose commit lands after its
stamp loses nothing."""

from __future__ import annotations

import json
import signal
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from tests.operate.conftest import Env
from tests.support import wait_until

SECOND = timedelta(seconds=1)

SLOW_COMMIT = """
CREATE FUNCTION oncely_test_slow_commit() RETURNS trigger AS $$
BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$ LANGUAGE plpgsql;
CREATE CONSTRAINT TRIGGER oncely_test_slow_commit AFTER INSERT ON oncely_audit
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION oncely_test_slow_commit();
"""
"""Every audited action's commit lands 1.5 s after its statements (the trigger runs at COMMIT)."""


def ticks(env: Env) -> list[datetime]:
    return sorted(datetime.fromisoformat(s) for s in env.effects("tick"))


def pause_row(env: Env) -> tuple[datetime, datetime | None]:
    """The one pause of `tick`, as `explain` reads it: (paused_at, resumed_at)."""
    rows = env.rows("SELECT paused_at, resumed_at FROM oncely_pauses WHERE job = 'tick'")
    assert len(rows) == 1, rows
    paused_at, resumed_at = rows[0]
    return _utc(paused_at), None if resumed_at is None else _utc(resumed_at)


def _utc(value: object) -> datetime:
    """A time read back with plain SQL (SQLite: naive UTC text) as an aware datetime."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def resumed(env: Env) -> datetime:
    resumed_at = pause_row(env)[1]
    assert resumed_at is not None
    return resumed_at


def stop(worker: subprocess.Popen[str], log: Path) -> None:
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, log.read_text()[-2000:]


def assert_fates(env: Env, ran: list[datetime], paused_at: datetime, resumed_at: datetime) -> None:
    """Every slot from the first to the last that ran, outside [paused_at, resumed_at), ran
    exactly once; none inside it did."""
    assert len(ran) == len(set(ran)), ran  # once per slot
    expected, slot = [], ran[0]
    while slot <= ran[-1]:
        if not paused_at <= slot < resumed_at:
            expected.append(slot)
        slot += SECOND
    missing = sorted(set(expected) - set(ran))
    inside = [s for s in ran if paused_at <= s < resumed_at]
    assert (missing, inside) == ([], []), (paused_at, resumed_at)
    for slot in missing[:1] or expected[-1:]:
        answer = json.loads(env.cli("explain", "tick", "--slot", slot.isoformat(), "--json").stdout)
        assert answer["answer"] == "ran", answer


@pytest.mark.timeout(240)
def test_worker_down_then_pause_then_worker_up_runs_every_slot_outside_the_pause(
    env: Env,
) -> None:
    log = env.tmp / "worker.log"
    worker = env.popen("worker", "--jobs", "tick", "--concurrency", "0", log=log)
    wait_until(lambda: len(env.effects("tick")) >= 2, "ticks from the worker", deadline=120)
    stop(worker, log)
    last = ticks(env)[-1]
    wait_until(lambda: env.db_now() > last + 8 * SECOND, "eight slots with no worker", deadline=30)
    assert env.cli("pause", "tick", "--actor", "ops@test").returncode == 0
    paused_at, _ = pause_row(env)
    before = int((paused_at - last) / SECOND)  # the slots due while no worker ran
    assert before >= 8
    worker = env.popen("worker", "--jobs", "tick", "--concurrency", "0", log=log)
    try:
        # catch_up="all": the slots before the pause run, the pause holds the rest
        caught = [last + n * SECOND for n in range(1, before + 1)]
        wait_until(lambda: set(caught) <= set(ticks(env)), "the slots before the pause")
        assert env.cli("resume", "tick", "--actor", "ops@test").returncode == 0
        resumed_at = resumed(env)
        wait_until(
            lambda: len([s for s in ticks(env) if s >= resumed_at]) >= 3,
            "ticks after resume",
        )
    finally:
        stop(worker, log)
    assert_fates(env, ticks(env), paused_at, resumed_at)


@pytest.mark.timeout(240)
def test_a_resume_whose_commit_lands_late_loses_nothing(pg_env: Env) -> None:
    env = pg_env
    log = env.tmp / "worker.log"
    worker = env.popen("worker", "--jobs", "tick", "--concurrency", "0", log=log)
    try:
        wait_until(lambda: len(env.effects("tick")) >= 2, "ticks from the worker", deadline=120)
        assert env.cli("pause", "tick", "--actor", "ops@test").returncode == 0
        paused_at, _ = pause_row(env)
        wait_until(lambda: env.db_now() > paused_at + 3 * SECOND, "slots in the pause", deadline=30)
        with env.engine.begin() as conn:
            conn.exec_driver_sql(SLOW_COMMIT)
        assert env.cli("resume", "tick", "--actor", "ops@test").returncode == 0
        with env.engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER oncely_test_slow_commit ON oncely_audit")
        resumed_at = resumed(env)
        wait_until(
            lambda: len([s for s in ticks(env) if s >= resumed_at]) >= 4,
            "ticks after resume",
        )
    finally:
        stop(worker, log)
    late = [s for s in ticks(env) if resumed_at <= s < resumed_at + 1.5 * SECOND]
    assert late, "no slot fell between the resume's stamp and its commit"
    assert_fates(env, ticks(env), paused_at, resumed_at)
