"""`oncely verify`: every expected slot of a real ledger accounted for by the fate model, the
findings when one is not, and bad input refused (exit 2) before anything is read."""

from __future__ import annotations

import json
from typing import Any

from tests.operate.conftest import Env

SLOT = "2026-11-30T10:00:00Z"
WINDOW = ("--since", "2026-11-30T09:30:00Z", "--until", "2026-11-30T10:30:00Z")


def verify(env: Env, *args: str, code: int = 0) -> dict[str, Any]:
    done = env.cli("verify", *args, "--json")
    assert done.returncode == code, (done.stdout, done.stderr)
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def slots(answer: dict[str, Any], job: str) -> list[tuple[str, str]]:
    (found,) = [j for j in answer["jobs"] if j["job"] == job]
    return [(s["slot"], s["fate"]) for s in found["slots"]]


def test_a_ledger_whose_slots_ran_or_were_given_up_is_accounted_for(env: Env) -> None:
    assert env.cli("run", "hourly", "--now", SLOT).returncode == 0
    assert env.cli("run", "boom", "--now", SLOT).returncode == 1
    answer = verify(env, "hourly", "boom", *WINDOW)
    assert answer["ok"] is True and answer["findings"] == []
    assert slots(answer, "hourly") == [("2026-11-30T10:00:00+00:00", "ran")]
    (given_up,) = [s for j in answer["jobs"] if j["job"] == "boom" for s in j["slots"]]
    assert given_up["fate"] == "given_up"
    assert given_up["detail"] == "failed: the upstream answered 503"
    text = env.cli("verify", "hourly", "boom", *WINDOW)
    assert text.returncode == 0
    assert "hourly: 1 slots (1 ran): all accounted for" in text.stdout
    assert "every expected slot and task is accounted for" in text.stdout


def test_a_due_slot_that_did_not_run_is_a_finding(env: Env) -> None:
    assert env.cli("run", "hourly", "--now", SLOT).returncode == 0
    until = ("--since", "2026-11-30T09:30:00Z", "--until", "2026-11-30T11:30:00Z")
    answer = verify(env, "hourly", *until, code=1)
    assert slots(answer, "hourly") == [
        ("2026-11-30T10:00:00+00:00", "ran"),
        ("2026-11-30T11:00:00+00:00", "unaccounted"),
    ]
    assert [(f["kind"], f["slot"]) for f in answer["findings"]] == [
        ("unaccounted", "2026-11-30T11:00:00+00:00")
    ]
    text = env.cli("verify", "hourly", *until)
    assert text.returncode == 1
    assert "[unaccounted] hourly slot 2026-11-30T11:00:00+00:00 was due and neither ran" in (
        text.stdout
    )


def test_a_claim_made_under_an_older_key_function_is_a_finding(env: Env) -> None:
    """A deploy changed the key function: the claim of 10:00 under the old key no longer
    guards the slot, whose key is another one now."""
    assert env.cli("run", "hourly", "--now", SLOT).returncode == 0
    with env.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE oncely_runs SET key = 'v1:' || key WHERE job = 'hourly'")
    answer = verify(env, "hourly", *WINDOW, code=1)
    assert slots(answer, "hourly") == [("2026-11-30T10:00:00+00:00", "ran")]
    (finding,) = answer["findings"]
    assert finding["kind"] == "key_changed" and finding["key"].startswith("v1:")


def test_the_first_appearance_is_recorded_once(env: Env) -> None:
    assert env.cli("run", "hourly", "--now", SLOT).returncode == 0
    first = env.rows("SELECT first_seen FROM oncely_jobs WHERE name = 'hourly'")
    assert len(first) == 1
    assert env.cli("run", "hourly", "--now", "2026-11-30T11:00:00Z").returncode == 0
    assert env.rows("SELECT first_seen FROM oncely_jobs WHERE name = 'hourly'") == first


def test_bad_input_is_one_line_and_exit_code_2(env: Env) -> None:
    cases = {
        ("nosuchjob",): "nosuchjob",
        ("--since", "yesterday"): "--since",
        ("--since", "2026-11-30T10:00:00"): "no UTC offset",
        ("--since", "2026-11-30T11:00:00Z", "--until", "2026-11-30T10:00:00Z"): "bad window",
    }
    for args, words in cases.items():
        done = env.cli("verify", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert words in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert env.rows("SELECT count(*) FROM oncely_audit") == [(0,)]


def test_explain_says_a_slot_before_the_job_appeared_was_never_expected(env: Env) -> None:
    assert env.cli("run", "hourly", "--now", SLOT).returncode == 0
    done = env.cli("explain", "hourly", "--slot", "2026-11-30T09:00:00Z", "--json")
    answer = json.loads(done.stdout)
    assert answer["answer"] == "before_job", answer
    assert answer["fields"]["first_seen"] == "2026-11-30T10:00:00+00:00"
    done = env.cli("explain", "hourly", "--slot", "2026-11-30T11:00:00Z", "--json")
    assert json.loads(done.stdout)["answer"] == "no_worker"
