"""The audit trail: every operator action leaves exactly one row, written in the action's own
transaction (database time, actor, action, target, reason, result); a refused action says so."""

from __future__ import annotations

import json
import re

from tests.operate.conftest import Env

SLOT = "2026-11-30T10:00:00Z"
RANGE = ["--from", "2026-11-30T08:00:00Z", "--to", "2026-11-30T10:00:00Z"]


def test_each_action_leaves_one_row(env: Env) -> None:
    actor = ["--actor", "ops@test"]
    steps = [
        (["pause", "hourly", "--reason", "incident", *actor], 0, ("pause", "paused")),
        (["resume", "hourly", *actor], 0, ("resume", "resumed")),
        (["run", "hourly", "--now", SLOT], 0, None),  # not an operator action
        (["release", "hourly", SLOT, *actor], 0, ("release", r"released \(ran at \S+ by \S+\)")),
        (["backfill", "hourly", *RANGE, "--apply", *actor], 0, ("backfill", "ran 2")),
        (["backfill", "hourly", *RANGE], 0, None),  # a plan changes nothing
        (["enqueue", "chore", "--json", '{"n": 1}'], 0, None),
        (["enqueue", "chore", "--json", '{"n": 2}'], 0, None),
        (["tasks", "discard", "1", *actor], 0, ("task_discard", "discarded")),
        (["tasks", "retry", "1", *actor], 0, ("task_retry", "available now")),
        (["tasks", "cancel", "2", *actor], 0, ("task_cancel", r"discarded \(it had not started\)")),
        (["tasks", "retry", "2", *actor], 0, ("task_retry", "available now")),
        (["prune", "--older-than", "1h", *actor], 0, ("prune", None)),
        (["explain", "hourly", "--slot", SLOT], 0, None),
    ]
    expected = []
    for args, code, row in steps:
        done = env.cli(*args)
        assert done.returncode == code, (args, done.stderr)
        if row is not None:
            expected.append(row)
        trail = [(a[0], a[2]) for a in env.audit()]
        assert len(trail) == len(expected), (args, trail)
        for (action, result), (want_action, want_result) in zip(trail, expected, strict=True):
            assert action == want_action
            assert want_result is None or re.fullmatch(want_result, result), (args, result)
    assert {a[3] for a in env.audit()} == {"ops@test"}
    listed = json.loads(env.cli("audit", "--json").stdout)
    assert [e["action"] for e in listed] == [a for a, _ in reversed(expected)]
    assert listed[-1]["reason"] == "incident" and listed[-1]["job"] == "hourly"
    assert listed[0]["result"].startswith("0 tasks, 0 claims, ")
    only = json.loads(env.cli("audit", "--job", "hourly", "--limit", "2", "--json").stdout)
    assert [e["action"] for e in only] == ["backfill", "release"]
    table = env.cli("audit").stdout.splitlines()
    assert table[0].split() == ["AT", "ACTOR", "ACTION", "TARGET", "RESULT", "REASON"]


def test_a_refused_action_says_so(env: Env) -> None:
    assert env.cli("enqueue", "chore", "--json", '{"n": 1}').returncode == 0
    assert env.cli("tasks", "discard", "1").returncode == 0
    refused = env.cli("tasks", "discard", "1", "--actor", "ops@test")
    assert refused.returncode == 2 and "is discarded" in refused.stderr
    assert env.cli("resume", "hourly").returncode == 2
    trail = env.audit()
    assert [(a[0], a[2].split(":")[0]) for a in trail] == [
        ("task_discard", "discarded"),
        ("task_discard", "refused"),
        ("resume", "refused"),
    ]
    assert "only available, running or dead tasks can be discarded" in trail[1][2]


def test_release_of_a_running_slot_is_refused_unless_forced(env: Env) -> None:
    from pathlib import Path

    from tests.support import wait_until

    assert env.cli("run", "hourly", "--now", SLOT).returncode == 0
    holder = env.popen("run", "hold", "--now", SLOT)
    try:
        wait_until(lambda: Path(f"{env.tmp / 'release'}.started").exists(), "hold to start")
        refused = env.cli("release", "hold", SLOT)
        assert refused.returncode == 2 and "is running right now" in refused.stderr
    finally:
        (env.tmp / "release").touch()
        holder.communicate(timeout=60)
    if env.db_url.startswith("postgres"):
        # On SQLite the running attempt holds the write lock the refusal's row needs.
        assert env.audit()[-1][0] == "release"
        assert env.audit()[-1][2].startswith("refused: job 'hold' key")
    forced = env.cli("release", "hold", SLOT, "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["status"] == "released"
    assert re.fullmatch(r"released \(ran at \S+ by \S+\) \(--force\)", env.audit()[-1][2])
