"""`oncely rename OLD NEW` carries a job's whole history in one transaction: its claims, its
pauses (open and closed), its given-up and skipped-on-purpose slots, its releases and other
audit rows, and its first appearance. The renamed job keeps every fate it had; a name that
has a history of its own is refused; a rename that fails half-way changes nothing."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from typing import Any

from tests.operate.conftest import Env, iso
from tests.support import Ran, invoke_cli, one_clear_line, snapshot, wait_until

OLD_APP = "tests.apps.rename_app:app"
NEW_APP = "tests.apps.rename_app_next:app"
S1, S2, S3, S4 = (f"2026-12-01T10:00:0{n}+00:00" for n in range(1, 5))
"""A slot that ran, one given up, one that ran and was released, one skipped on purpose."""


def oncely(env: Env, app: str, *args: str) -> Ran:
    """`oncely ARGS` with one release's app (`report` fails at S2), in this process."""
    sys.modules.pop(app.split(":")[0], None)
    extra = {"ONCELY_TEST_FAIL_AT": S2}
    return invoke_cli("--app", app, "--database-url", env.db_url, *args, env=extra)


def ok(ran: Ran) -> Ran:
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    return ran


def old_history(env: Env) -> datetime:
    """Under `report`: S1 ran, S2 given up, S3 ran then released, S4 skipped, and a pause
    in force from the returned time on."""
    for slot in (S1, S3):
        ok(oncely(env, OLD_APP, "run", "report", "--now", slot))
    assert oncely(env, OLD_APP, "run", "report", "--now", S2).returncode == 1
    ok(oncely(env, OLD_APP, "release", "report", S3.replace("+00:00", "Z"), "--reason", "redo"))
    ok(oncely(env, OLD_APP, "skip", "report", S4.replace("+00:00", "Z"), "--reason", "holiday"))
    paused = json.loads(ok(oncely(env, OLD_APP, "pause", "report", "--json")).stdout)
    return datetime.fromisoformat(paused["paused_at"])


def ledger(env: Env) -> dict[str, Any]:
    """Every table a rename touches, first appearances included."""
    return {
        **snapshot(env.db_url),
        "jobs": sorted(map(tuple, env.rows("SELECT * FROM oncely_jobs"))),
    }


def names(env: Env) -> dict[str, set[str]]:
    """Which job names each history table holds."""
    found = {}
    for table, column in [
        ("oncely_runs", "job"),
        ("oncely_attempts", "job"),
        ("oncely_pauses", "job"),
        ("oncely_audit", "job"),
        ("oncely_jobs", "name"),
    ]:
        found[table] = {r[0] for r in env.rows(f"SELECT {column} FROM {table}")}
    return found


def test_a_renamed_job_keeps_its_pause_given_up_skipped_and_released_slots(env: Env) -> None:
    paused_at = old_history(env)
    first_seen = env.rows("SELECT first_seen FROM oncely_jobs WHERE name = 'report'")[0][0]

    done = ok(
        oncely(env, NEW_APP, "rename", "report", "daily_report", "--actor", "ana", "--reason", "v2")
    )
    assert "moved 1 claims, 2 attempt records, 1 pauses" in done.stdout, done.stdout
    assert names(env) == {
        "oncely_runs": {"daily_report"},
        "oncely_attempts": {"daily_report"},
        "oncely_pauses": {"daily_report"},
        "oncely_audit": {"daily_report"},
        "oncely_jobs": {"daily_report"},
    }
    got = env.rows("SELECT first_seen FROM oncely_jobs WHERE name = 'daily_report'")[0][0]
    assert iso(got) == iso(first_seen)  # the job's first appearance, not the rename's

    # Still paused under its new name: a slot inside the pause does not run.
    inside = (paused_at + timedelta(seconds=1)).replace(microsecond=0)
    wait_until(lambda: env.db_now() >= inside, "a slot inside the pause is due")
    paused = oncely(env, NEW_APP, "run", "daily_report", "--now", inside.isoformat(), "--json")
    assert json.loads(paused.stdout)["status"] == "paused", paused.stdout
    # Given up stays given up, skipped stays skipped: neither runs under the new name.
    given_up = oncely(env, NEW_APP, "run", "daily_report", "--now", S2)
    assert given_up.returncode == 1 and "given up" in given_up.stderr, given_up.stderr
    ok(oncely(env, NEW_APP, "run", "daily_report", "--now", S4))
    assert env.effects("daily_report") == []

    # history and explain of the new name tell the old name's slots, the released one too.
    shown = json.loads(ok(oncely(env, NEW_APP, "history", "daily_report", "--json")).stdout)
    assert [c["key"] for c in shown] == [S1.replace("+00:00", "Z")], shown
    told = ok(oncely(env, NEW_APP, "explain", "daily_report", "--slot", S3, "--json"))
    releases = json.loads(told.stdout)["fields"]["releases"]
    assert [(r["by"], r["reason"]) for r in releases] == [(releases[0]["by"], "redo")], releases
    assert "released" in json.loads(told.stdout)["sentence"], told.stdout
    # The audit of the new name has the old name's actions and the rename, actor and reason.
    trail = json.loads(ok(oncely(env, NEW_APP, "audit", "--job", "daily_report", "--json")).stdout)
    rows = [(a["action"], a["target"], a["actor"], a["reason"]) for a in trail]
    assert rows[0] == ("rename", "report -> daily_report", "ana", "v2"), rows
    assert {(r[0], r[1]) for r in rows[1:]} == {
        ("release", f"daily_report {S3.replace('+00:00', 'Z')}"),
        ("skip", f"daily_report {S4.replace('+00:00', 'Z')}"),
        ("pause", "daily_report"),
    }, rows


def test_a_rename_onto_a_name_with_a_history_is_refused_and_changes_nothing(env: Env) -> None:
    old_history(env)
    # `daily_report` has no claim, only a pause and its audit rows: a history all the same.
    ok(oncely(env, NEW_APP, "pause", "daily_report"))
    before = ledger(env)
    refused = oncely(env, NEW_APP, "rename", "report", "daily_report", "--force")
    assert refused.returncode == 2
    assert "already has a history" in one_clear_line(refused.stderr)
    assert ledger(env) == before


REFUSE_PAUSE_MOVE = {
    "sqlite": [
        "CREATE TRIGGER refuse_move BEFORE UPDATE OF job ON oncely_pauses"
        " BEGIN SELECT RAISE(ABORT, 'pause move refused by the test'); END"
    ],
    "postgres": [
        "CREATE FUNCTION refuse_move() RETURNS trigger AS $$ BEGIN"
        " RAISE EXCEPTION 'pause move refused by the test'; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER refuse_move BEFORE UPDATE OF job ON oncely_pauses"
        " FOR EACH ROW EXECUTE FUNCTION refuse_move()",
    ],
}


def test_a_rename_that_fails_half_way_leaves_everything_under_the_old_name(env: Env) -> None:
    """The database refuses to move the pauses, after the claims and attempt records moved
    in the same transaction: nothing stays moved. Without the fault it moves everything."""
    old_history(env)
    fault = REFUSE_PAUSE_MOVE["postgres" if env.db_url.startswith("postgres") else "sqlite"]
    with env.engine.begin() as conn:
        for statement in fault:
            conn.exec_driver_sql(statement)
    before = ledger(env)
    failed = oncely(env, NEW_APP, "rename", "report", "daily_report")
    assert failed.returncode != 0 and "Traceback" not in failed.stderr, failed.stderr
    assert ledger(env) == before
    assert names(env)["oncely_runs"] == {"report"}
    with env.engine.begin() as conn:
        conn.exec_driver_sql(
            "DROP TRIGGER refuse_move" + (" ON oncely_pauses" if len(fault) > 1 else "")
        )
    ok(oncely(env, NEW_APP, "rename", "report", "daily_report"))
    assert set().union(*names(env).values()) == {"daily_report"}
