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
