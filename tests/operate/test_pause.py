"""Pause and resume: three real worker processes and an every-second job. A pause stops
every worker from the next scheduling step on, `oncely run` of a slot inside it prints it and
exits 0, a resume starts the slots again without catching up the paused ones, and explain
calls them paused; a slot before the pause is outside it and runs."""

from __future__ import annotations

import json
import signal
from datetime import datetime, timedelta

import pytest
from tests.operate.conftest import Env, iso
from tests.support import wait_until

STEP = timedelta(seconds=1)
"""One scheduling step of an every-second job: a slot a worker had already begun may start."""


def slots(env: Env) -> list[datetime]:
    return sorted(datetime.fromisoformat(s) for s in env.effects("tick"))


@pytest.mark.timeout(240)
def test_pause_stops_every_worker_and_resume_does_not_catch_up(env: Env) -> None:
    logs = [env.tmp / f"worker-{n}.log" for n in range(3)]
    workers = [env.popen("worker", "--jobs", "tick", "--concurrency", "0", log=log) for log in logs]
    try:
        wait_until(lambda: len(env.effects("tick")) >= 3, "ticks from the workers", deadline=120)
        paused = env.cli("pause", "tick", "--reason", "bad deploy", "--actor", "ops@test")
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.startswith("paused tick (by ops@test at "), paused.stdout
        listed = json.loads(env.cli("list", "--json").stdout)
        tick = next(j for j in listed if j.get("name") == "tick")
        paused_at = datetime.fromisoformat(tick["paused"]["paused_at"])
        # Three more slots come due while paused: none of them starts anywhere.
        wait_until(
            lambda: env.db_now() > paused_at + 3.5 * STEP, "three slots of pause", deadline=30
        )
        during = [s for s in slots(env) if s > paused_at + STEP]
        assert during == [], during

        run = env.oncely("run", "tick")
        assert run.returncode == 0, run.stderr
        assert run.stdout.startswith("paused tick slot "), run.stdout
        assert "(by ops@test at " in run.stdout and ": bad deploy)" in run.stdout
        table = env.cli("list").stdout
        assert "paused by ops@test" in table, table

        assert env.cli("resume", "tick", "--actor", "ops@test").returncode == 0
        resumed_at = env.db_now()
        wait_until(
            lambda: len([s for s in slots(env) if s > resumed_at]) >= 2,
            "ticks after resume",
        )
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        codes = [w.wait(timeout=60) for w in workers]
    assert codes == [0, 0, 0], [log.read_text()[-2000:] for log in logs]
    ran = slots(env)
    assert len(ran) == len(set(ran))  # once per slot, across the three workers
    # The slots of the pause were not caught up on resume (tick has catch_up="all").
    gap = [s for s in ran if paused_at + STEP < s < resumed_at - STEP]
    assert gap == [], gap
    inside = paused_at + 2 * STEP
    inside = inside.replace(microsecond=0)
    answer = json.loads(env.cli("explain", "tick", "--slot", iso(inside), "--json").stdout)
    assert answer["answer"] == "paused", answer
    assert (answer["fields"]["by"], answer["fields"]["reason"]) == ("ops@test", "bad deploy")
    assert [row[0] for row in env.audit()] == ["pause", "resume"]


def test_pause_twice_is_refused_and_audited(env: Env) -> None:
    assert env.cli("pause", "hourly").returncode == 0
    again = env.cli("pause", "hourly")
    assert again.returncode == 2
    assert "is already paused" in again.stderr, again.stderr
    assert env.cli("resume", "hourly").returncode == 0
    not_paused = env.cli("resume", "hourly")
    assert not_paused.returncode == 2 and "is not paused" in not_paused.stderr
    assert [(a[0], a[2].split(":")[0]) for a in env.audit()] == [
        ("pause", "paused"),
        ("pause", "refused"),
        ("resume", "resumed"),
        ("resume", "refused"),
    ]


def test_run_json_says_paused(env: Env) -> None:
    assert env.cli("pause", "tick", "--reason", "maintenance").returncode == 0
    paused_at = _paused_at(env, "tick")
    wait_until(lambda: env.db_now() >= paused_at + STEP, "a slot inside the pause", deadline=10)
    inside = (paused_at + STEP).replace(microsecond=0)
    done = env.cli("run", "tick", "--now", iso(inside), "--json")
    assert done.returncode == 0
    data = json.loads(done.stdout)
    assert (data["status"], data["paused"]["reason"]) == ("paused", "maintenance")
    assert env.effects("tick") == []
    answer = json.loads(env.cli("explain", "tick", "--slot", iso(inside), "--json").stdout)
    assert answer["answer"] == "paused", answer


def test_run_of_a_slot_before_the_pause_runs_while_the_pause_is_in_force(env: Env) -> None:
    # the pause covers the slots from its start on, not every slot while it is in force
    assert env.cli("pause", "hourly", "--reason", "maintenance").returncode == 0
    done = env.cli("run", "hourly", "--now", "2026-11-30T10:00:00Z", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "ran"
    assert env.effects("hourly") == ["2026-11-30T10:00:00+00:00"]
    slot = "2026-11-30T10:00:00Z"
    answer = json.loads(env.cli("explain", "hourly", "--slot", slot, "--json").stdout)
    assert answer["answer"] == "ran", answer


def _paused_at(env: Env, job: str) -> datetime:
    listed = json.loads(env.cli("list", "--json").stdout)
    return datetime.fromisoformat(
        next(j for j in listed if j["name"] == job)["paused"]["paused_at"]
    )
