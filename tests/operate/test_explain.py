"""`oncely explain JOB --slot T`: one test per answer, each produced for real (a job that
ran, raised, timed out, was cancelled, was SIGKILLed mid-slot, ran past a grace window,
was dropped by catch-up, skipped for overlap; a slot not due yet; one no worker saw)."""

from __future__ import annotations

import json
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.operate.conftest import Env, iso
from tests.support import wait_until

SLOT = "2026-11-30T10:00:00Z"


def explain(env: Env, job: str, slot: str = SLOT) -> dict[str, Any]:
    done = env.cli("explain", job, "--slot", slot, "--json")
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def test_a_slot_that_ran(env: Env) -> None:
    assert env.cli("run", "hourly", "--now", SLOT).returncode == 0
    answer = explain(env, "hourly")
    assert answer["answer"] == "ran", answer
    assert answer["fields"]["by"] and answer["fields"]["duration_ms"] is not None
    # A quick attempt that succeeds needs no record on Postgres: its claim says it all.
    assert [a["outcome"] for a in answer["attempts"]] in ([], ["ran"])
    text = env.cli("explain", "hourly", "--slot", SLOT).stdout
    assert text.startswith("hourly slot 2026-11-30T10:00:00+00:00 ran: claimed by "), text


def test_a_slot_whose_job_raised_is_given_up_then_released(env: Env) -> None:
    assert env.cli("run", "boom", "--now", SLOT).returncode == 1
    spent = env.cli("run", "boom", "--now", SLOT)  # given up: not started, and loud
    assert spent.returncode == 1 and "given up after 1 attempt" in spent.stderr
    answer = explain(env, "boom")
    assert answer["answer"] == "failed", answer
    assert [(a["outcome"], a["error_class"], a["error"]) for a in answer["attempts"]] == [
        ("failed", "RuntimeError", "the upstream answered 503")
    ]
    assert answer["attempts"][0]["given_up"] is True
    assert (
        "given up after 1 attempt: no replica starts it again (`oncely release boom"
        in (answer["sentence"])
    )
    assert "`oncely skip boom " in answer["sentence"]
    released = env.cli("release", "boom", SLOT, "--actor", "ana", "--reason", "fixed upstream")
    assert released.returncode == 0
    answer = explain(env, "boom")
    assert answer["answer"] == "released", answer
    assert "was released (given up) by ana at " in answer["sentence"]
    assert "(fixed upstream): it may run again" in answer["sentence"]
    assert env.cli("run", "boom", "--now", SLOT).returncode == 1  # released: it runs again
    answer = explain(env, "boom")
    assert "failed (2 attempts)" in answer["sentence"] and "given up" in answer["sentence"]
    assert env.effects("boom") == []  # rolled back: guarantee 2 stands


def test_a_slot_that_ran_and_was_released_keeps_its_history(env: Env) -> None:
    """A released slot is never "before the job": who ran it and who freed it are kept,
    and a run after the release says so."""
    assert env.cli("run", "hourly", "--now", SLOT).returncode == 0
    with env.engine.begin() as conn:  # the job's recorded first appearance comes later
        conn.exec_driver_sql("DELETE FROM oncely_jobs")
    assert env.cli("run", "hourly", "--now", "2026-11-30T12:00:00Z").returncode == 0
    freed = env.cli("release", "hourly", SLOT, "--actor", "ana", "--reason", "wrong total")
    assert freed.returncode == 0
    answer = explain(env, "hourly")
    assert answer["answer"] == "released", answer
    assert " was released (ran at 20" in answer["sentence"]
    assert " by ana at " in answer["sentence"] and "(wrong total)" in answer["sentence"]
    (release,) = answer["fields"]["releases"]
    assert (release["by"], release["reason"]) == ("ana", "wrong total")
    assert env.cli("run", "hourly", "--now", SLOT).returncode == 0
    answer = explain(env, "hourly")
    assert answer["answer"] == "ran"
    assert "It ran again after it was released (ran at " in answer["sentence"]


def test_a_failed_slot_waits_for_its_retry_with_the_attempts_left(env: Env) -> None:
    """A job without `retry=` retries a failed slot (5 attempts): explain says when, and how
    many attempts are left."""
    assert env.cli("run", "flaky", "--now", SLOT).returncode == 1
    answer = explain(env, "flaky")
    assert answer["answer"] == "failed", answer
    assert answer["fields"]["attempts_left"] == 4 and answer["fields"]["retry_at"]
    assert "(4 of 5 attempts left); `oncely run` retries it now" in answer["sentence"]


def test_a_slot_that_timed_out(env: Env) -> None:
    assert env.cli("run", "slow", "--now", SLOT).returncode == 1
    answer = explain(env, "slow")
    assert answer["answer"] == "timeout", answer
    assert answer["attempts"][0]["error_class"] == "JobTimeoutError"


@pytest.mark.postgres
def test_a_slot_that_was_cancelled(pg_env: Env) -> None:
    """Postgres: on SQLite the running attempt holds the write lock a cancel needs."""
    env = pg_env
    holder = env.popen("run", "hold", "--now", SLOT)
    try:
        wait_until(lambda: explain(env, "hold")["answer"] == "running", "hold runs")
        assert env.cli("cancel", "hold", "--actor", "ops@test").returncode == 0
        assert holder.wait(timeout=10) == 1
    finally:
        (env.tmp / "release").touch()
        holder.communicate(timeout=30)
    answer = explain(env, "hold")
    assert answer["answer"] == "cancelled", answer
    assert answer["attempts"][0]["cancel_requested_by"] == "ops@test"
    assert "stopped by ops@test" in answer["sentence"]


@pytest.mark.postgres
def test_a_slot_whose_worker_was_sigkilled(pg_env: Env) -> None:
    """Postgres: on SQLite an attempt's start is not recorded (its write lock is the
    attempt's until it ends), so a killed one leaves nothing to explain but the free slot."""
    env = pg_env
    holder = env.popen("run", "hold", "--now", SLOT)
    try:
        wait_until(lambda: Path(f"{env.tmp / 'release'}.started").exists(), "hold starts")
        # Its start is recorded once it has run 1 s.
        wait_until(lambda: explain(env, "hold")["answer"] == "running", "hold runs")
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        holder.communicate(timeout=30)
    # The server ends the dead client's session (and its slot lock) on its own time.
    wait_until(lambda: explain(env, "hold")["answer"] == "died", "the holder to be gone")
    answer = explain(env, "hold")
    assert "never recorded an end" in answer["sentence"], answer
    assert env.effects("hold") == []
    (env.tmp / "release").touch()
    assert env.oncely("run", "hold", "--now", SLOT).returncode == 0  # the slot was free


def test_slots_a_worker_dropped_or_skipped(env: Env) -> None:
    """One worker: `lagging` (catch_up=latest, its last claim 10 s old), `graceless` (every
    slot later than its grace), `overlapper` (each run lasts 2.5 s of 1 s slots)."""
    ten_ago = (env.db_now() - timedelta(seconds=10)).isoformat()
    assert env.cli("run", "lagging", "--now", ten_ago).returncode == 0
    log = env.tmp / "worker.log"
    worker = env.popen(
        "worker", "--jobs", "lagging,graceless,overlapper", "--concurrency", "0", log=log
    )
    try:
        wait_until(
            lambda: (
                len(env.rows("SELECT 1 FROM oncely_attempts WHERE outcome = 'overlap'")) >= 2
                and env.rows("SELECT 1 FROM oncely_attempts WHERE job = 'graceless'")
            ),
            "overlap and grace records",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, log.read_text()
    missed = env.rows(
        "SELECT slot, slot_last FROM oncely_attempts WHERE job = 'lagging' AND outcome = 'missed'"
    )
    assert missed, log.read_text()
    first = missed[0][0]
    answer = explain(env, "lagging", iso(first))
    assert (answer["answer"], answer["fields"]["reason"]) == ("missed", "catch_up"), answer
    assert "catch-up policy (catch_up=latest)" in answer["sentence"]

    graced = env.rows("SELECT slot FROM oncely_attempts WHERE job = 'graceless'")[0][0]
    answer = explain(env, "graceless", iso(graced))
    assert (answer["answer"], answer["fields"]["reason"]) == ("missed", "grace"), answer
    assert env.effects("graceless") == []

    skipped = env.rows(
        "SELECT slot FROM oncely_attempts WHERE job = 'overlapper' AND outcome = 'overlap'"
    )[0][0]
    assert iso(skipped) not in env.effects("overlapper")
    answer = explain(env, "overlapper", iso(skipped))
    assert answer["answer"] == "overlap", answer


def test_a_slot_not_due_yet(env: Env) -> None:
    later = (env.db_now() + timedelta(hours=3)).isoformat()
    answer = explain(env, "hourly", later)
    assert answer["answer"] == "not_due", answer
    assert "is not due yet" in answer["sentence"]


def test_a_slot_no_worker_saw(env: Env) -> None:
    answer = explain(env, "hourly")
    assert answer["answer"] == "no_worker", answer
    assert answer["attempts"] == []
    assert "no worker was alive" in answer["sentence"]
