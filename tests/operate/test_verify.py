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


def test_a_given_up_slot_is_a_finding_until_an_operator_skips_it(env: Env) -> None:
    assert env.cli("run", "hourly", "--now", SLOT).returncode == 0
    assert env.cli("run", "boom", "--now", SLOT).returncode == 1
    answer = verify(env, "hourly", "boom", *WINDOW, code=1)
    (given_up,) = [s for j in answer["jobs"] if j["job"] == "boom" for s in j["slots"]]
    assert given_up["fate"] == "given_up"
    assert given_up["detail"] == "given up after 1 attempt (failed: the upstream answered 503)"
    assert [f["kind"] for f in answer["findings"]] == ["given_up"]
    text = env.cli("verify", "hourly", "boom", *WINDOW)
    assert text.returncode == 1
    assert "[given_up] boom slot 2026-11-30T10:00:00+00:00 did not run: given up" in text.stdout
    assert f"`oncely skip boom {SLOT} --reason TEXT`" in text.stdout
    skip = env.cli("skip", "boom", SLOT, "--reason", "the upstream is retired", "--actor", "ana")
    assert skip.returncode == 0, skip.stderr
    answer = verify(env, "hourly", "boom", *WINDOW)
    assert answer["ok"] is True and answer["findings"] == []
    assert slots(answer, "boom") == [("2026-11-30T10:00:00+00:00", "skipped")]
    (skipped,) = [s for j in answer["jobs"] if j["job"] == "boom" for s in j["slots"]]
    assert (skipped["by"], skipped["detail"]) == ("ana", "the upstream is retired")
    audit = env.rows("SELECT action, actor, reason, result FROM oncely_audit")
    assert ("skip", "ana", "the upstream is retired", "skipped on purpose") in audit
    text = env.cli("verify", "hourly", "boom", *WINDOW)
    assert text.returncode == 0
    assert "hourly: 1 slots (1 ran): all accounted for" in text.stdout
    assert "every expected slot and task is accounted for" in text.stdout


def test_skip_refuses_a_slot_that_ran_and_needs_a_reason(env: Env) -> None:
    assert env.cli("run", "hourly", "--now", SLOT).returncode == 0
    ran = env.cli("skip", "hourly", SLOT, "--reason", "no")
    assert ran.returncode == 2 and "ran: nothing to skip" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1
    assert env.cli("skip", "hourly", SLOT).returncode == 2  # --reason is required
    assert env.rows("SELECT count(*) FROM oncely_attempts WHERE outcome = 'operator_skip'") == [
        (0,)
    ]


def test_without_a_window_a_weekly_job_is_checked_at_its_last_slot(env: Env) -> None:
    """The default 24 hours hold no Friday most days: verify reaches back to the job's last
    expected slot rather than answer "all accounted for" about nothing, and says so."""
    # The job ran a Friday long ago (verify dates it from its oldest claim), and not since.
    assert env.cli("run", "weekly", "--now", "2026-10-02T18:00:00-06:00").returncode == 0
    answer = verify(env, "weekly", code=1)
    (job,) = answer["jobs"]
    assert job["since"] is not None
    assert [s["slot"] for s in job["slots"]][:1] == [job["since"]]
    assert {s["fate"] for s in job["slots"]} == {"unaccounted"}
    assert [f["kind"] for f in answer["findings"]] == ["unaccounted"] * len(job["slots"])
    text = env.cli("verify", "weekly")
    assert text.returncode == 1 and ", its last expected slot (" in text.stdout


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


def test_tasks_due_with_no_live_worker_are_a_finding_and_a_note(env: Env) -> None:
    """A charge task waits with no worker alive: verify fails and `oncely tasks` says so
    (before, verify exited 0 and the listing said nothing)."""
    enqueued = env.cli("enqueue", "chore", "--json", '{"n": 1}')
    assert enqueued.returncode == 0, enqueued.stderr
    ago = (
        "run_at - interval '60 seconds'"
        if env.db_url.startswith("postgres")
        else "datetime(run_at, '-60 seconds')"
    )
    with env.engine.begin() as conn:  # it has waited for a minute
        conn.exec_driver_sql(f"UPDATE oncely_tasks SET run_at = {ago}")
    answer = verify(env, "hourly", *WINDOW, code=1)
    assert [f["kind"] for f in answer["findings"]] == ["no_worker"]
    assert "1 task due since" in answer["findings"][0]["message"]
    listed = env.cli("tasks")
    assert listed.returncode == 0
    assert "note: no worker is live, and 1 available task(s) have waited since" in listed.stdout
