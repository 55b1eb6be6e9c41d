"""`oncely backfill`: a plan that changes nothing, an apply that runs each free slot once
(also when two applies of the same range race from two processes)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from tests.operate.conftest import Env

START = datetime(2026, 11, 29, 0, 0, tzinfo=timezone.utc)
RANGE = ["--from", "2026-11-29T00:00:00Z", "--to", "2026-11-30T00:00:00Z"]
RAN_BEFORE = [2, 3, 7, 11, 23]


def prepare(env: Env) -> None:
    for hour in RAN_BEFORE:
        slot = (START + timedelta(hours=hour)).isoformat()
        assert env.cli("run", "hourly", "--now", slot).returncode == 0


def test_plan_then_apply_then_apply_again(env: Env) -> None:
    prepare(env)
    before = env.rows("SELECT count(*) FROM oncely_runs")[0][0]
    planned = env.cli("backfill", "hourly", *RANGE, "--json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert len(plan) == 24
    assert sum(p["action"] == "would run" for p in plan) == 19
    assert [i for i, p in enumerate(plan) if p["action"] == "already ran"] == RAN_BEFORE
    assert env.rows("SELECT count(*) FROM oncely_runs")[0][0] == before  # a plan writes nothing
    text = env.cli("backfill", "hourly", *RANGE).stdout
    assert "19 of 24 slots would run" in text
    assert "already ran by " in text

    applied = env.cli("backfill", "hourly", *RANGE, "--apply")
    assert applied.returncode == 0, applied.stderr
    lines = applied.stdout.splitlines()
    assert len(lines) == 19 and all(line.startswith("ran hourly slot ") for line in lines)
    assert len(env.effects("hourly")) == 24  # 5 before, 19 now: each slot once

    again = env.cli("backfill", "hourly", *RANGE, "--apply", "--json")
    assert again.returncode == 0 and json.loads(again.stdout) == []
    assert len(env.effects("hourly")) == 24
    results = [a[2] for a in env.audit() if a[0] == "backfill"]
    assert results == ["ran 19", "nothing to run"]


def test_two_applies_at_once_run_each_slot_once(env: Env) -> None:
    prepare(env)
    procs = [env.popen("backfill", "hourly", *RANGE, "--apply", "--json") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    effects = env.effects("hourly")
    assert len(effects) == len(set(effects)) == 24
    ran = [r for out, _ in outs for r in json.loads(out) if r["status"] == "ran"]
    assert len(ran) == 19  # between the two of them


FUTURE = ["--from", "2031-01-01T00:00:00Z", "--to", "2031-01-01T03:00:00Z"]


def test_a_backfill_of_future_slots_is_refused_and_changes_nothing(env: Env) -> None:
    planned = json.loads(env.cli("backfill", "hourly", *FUTURE, "--json").stdout)
    assert [p["action"] for p in planned] == ["not due"] * 3
    refused = env.cli("backfill", "hourly", *FUTURE, "--apply")
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "3 slots of 'hourly' not due yet" in lines[0], refused.stderr
    assert "Traceback" not in refused.stderr
    assert env.effects("hourly") == []
    assert env.rows("SELECT count(*) FROM oncely_runs")[0][0] == 0
    ((action, _target, result, _actor),) = env.audit()
    assert action == "backfill" and result.startswith("refused: the range holds 3 slots")


def test_a_backfill_range_ending_in_the_future_is_refused(env: Env) -> None:
    now = env.db_now()
    start, end = now - timedelta(seconds=5), now + timedelta(seconds=90)
    span = ["--from", start.isoformat(), "--to", end.isoformat()]
    plan = json.loads(env.cli("backfill", "tick", *span, "--json").stdout)
    due = [p for p in plan if p["action"] == "would run"]
    ahead = [p for p in plan if p["action"] == "not due"]
    assert len(due) >= 4 and len(ahead) >= 80, plan
    assert all(p["slot"] > a["slot"] for p in ahead for a in due)
    refused = env.cli("backfill", "tick", *span, "--apply")
    assert refused.returncode == 2 and "not due yet" in refused.stderr
    assert env.effects("tick") == []  # not even the past ones: the whole range is refused


def test_allow_future_runs_them_on_purpose_and_says_so_in_the_audit(env: Env) -> None:
    applied = env.cli("backfill", "hourly", *FUTURE, "--apply", "--allow-future", "--json")
    assert applied.returncode == 0, applied.stderr
    assert [r["status"] for r in json.loads(applied.stdout)] == ["ran"] * 3
    assert len(env.effects("hourly")) == 3
    ((action, _target, result, _actor),) = env.audit()
    assert action == "backfill"
    assert result == "ran 3; --allow-future: 3 slots ahead of the database's clock"
