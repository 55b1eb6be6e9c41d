"""The fate of each expected slot, and the findings, from records built by hand: one test per
fate and per finding (oncely.fates is pure; tests/operate/test_verify.py checks a real ledger)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from oncely.fates import JobLedger, JobVerdict, unrunnable_findings, verify_job
from oncely.model import OPERATOR_SKIP, Attempt, Claim, Pause, Release

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=timezone.utc)
NOW = T0 + timedelta(minutes=10)
SLOTS = [T0 + timedelta(minutes=i) for i in range(12)]  # two of them after NOW


def key_for(t: datetime) -> str:
    return t.isoformat()


def claim(i: int, *, key: str | None = None, at: timedelta = timedelta(seconds=1)) -> Claim:
    t = SLOTS[i]
    return Claim("j", key or key_for(t), t, t + at, "r1", t + at)


def record(
    i: int, outcome: str | None, *, rid: int = 1, alive: bool = False, **kw: object
) -> Attempt:
    t = SLOTS[i]
    fields: dict[str, object] = {
        "id": rid,
        "job": "j",
        "key": key_for(t),
        "slot": t,
        "outcome": outcome,
        "replica": "r2",
        "started_at": t,
        "finished_at": None if outcome is None else t + timedelta(seconds=2),
        "recorded_at": t,
        "alive": alive,
        # A failed, timed-out or cancelled end is final unless said otherwise: what the
        # attempt's own transaction marks when it gives its slot up.
        "final": outcome in ("failed", "timeout", "cancelled"),
    }
    fields.update(kw)
    return Attempt(**fields)  # type: ignore[arg-type]


def verdict(
    *,
    claims: list[Claim] = [],  # noqa: B006 - read only
    records: list[Attempt] = [],  # noqa: B006
    pauses: list[Pause] = [],  # noqa: B006
    releases: list[Release] = [],  # noqa: B006
    first_seen: datetime | None = T0,
) -> JobVerdict:
    ledger = JobLedger("j", SLOTS, key_for, first_seen, claims, records, pauses, releases)
    return verify_job(ledger, NOW, leeway=timedelta(seconds=30))


def fates(v: JobVerdict) -> list[str]:
    return [s.fate for s in v.slots]


def kinds(v: JobVerdict) -> list[str]:
    return [f.kind for f in v.findings]


def test_every_slot_that_ran_is_accounted_for_and_later_ones_are_not_due() -> None:
    v = verdict(claims=[claim(i) for i in range(11)])
    assert fates(v) == ["ran"] * 11 + ["not_due"]
    assert v.findings == ()
    assert v.slots[0].by == "r1"


def test_a_due_slot_with_no_record_is_a_finding() -> None:
    v = verdict(claims=[claim(i) for i in range(11) if i != 4])
    assert fates(v)[4] == "unaccounted"
    assert kinds(v) == ["unaccounted"]
    assert v.findings[0].slot == SLOTS[4]
    assert "neither ran nor was skipped" in v.findings[0].message


def test_a_slot_that_came_due_moments_ago_is_due_not_a_finding() -> None:
    v = verdict(claims=[claim(i) for i in range(10)])
    assert fates(v)[10] == "due"  # SLOTS[10] == NOW: within the leeway
    assert v.findings == ()


def test_slots_before_the_job_first_appeared_are_not_expected() -> None:
    v = verdict(claims=[claim(i) for i in range(5, 11)], first_seen=SLOTS[4] + timedelta(seconds=1))
    assert fates(v)[:5] == ["before_job"] * 5
    assert v.findings == ()
    assert fates(verdict(first_seen=None))[:11] == ["before_job"] * 11


def release(i: int, after: timedelta, result: str = "released (given up)") -> Release:
    return Release(SLOTS[i] + after, key_for(SLOTS[i]), "ana@ops", "wrong total", result)


def test_a_given_up_slot_is_a_finding_until_settled_and_a_run_after_it_is_one_too() -> None:
    tried = record(3, "failed", rid=1, error="502", final=False, retry_at=SLOTS[3])
    failed = record(3, "failed", rid=2, error="503")
    v = verdict(claims=[claim(i) for i in range(11) if i != 3], records=[tried, failed])
    assert fates(v)[3] == "given_up"
    assert v.slots[3].detail == "given up after 2 attempts (failed: 503)"
    assert kinds(v) == ["given_up"]
    assert "oncely release j" in v.findings[0].message
    assert "oncely skip j" in v.findings[0].message
    failed = record(3, "failed", error="503")
    later = claim(3, at=timedelta(seconds=5))  # another replica ran it after the failure
    v = verdict(claims=[*(claim(i) for i in range(11) if i != 3), later], records=[failed])
    assert fates(v)[3] == "ran"
    assert kinds(v) == ["rerun"]


def test_an_attempt_that_lost_its_database_gives_nothing_up() -> None:
    """A lost connection is a crash by the model: the slot is free again, and runs."""
    lost = record(3, "failed", error_class="DatabaseUnavailableError", final=False)
    later = claim(3, at=timedelta(seconds=5))
    v = verdict(claims=[*(claim(i) for i in range(11) if i != 3), later], records=[lost])
    assert fates(v)[3] == "ran"
    assert v.findings == ()


def test_a_slot_skipped_on_purpose_is_accounted_for_with_its_reason() -> None:
    failed = record(3, "failed", rid=1, error="503")
    skip = record(3, OPERATOR_SKIP, rid=2, replica="ana@ops", error="paid by hand", final=True)
    v = verdict(claims=[claim(i) for i in range(11) if i != 3], records=[failed, skip])
    assert fates(v)[3] == "skipped"
    assert (v.slots[3].by, v.slots[3].detail) == ("ana@ops", "paid by hand")
    assert v.findings == ()


def test_a_slot_waiting_for_its_retry_says_which_attempt_failed_and_when_it_runs() -> None:
    later = NOW + timedelta(seconds=6)
    waiting = record(3, "failed", error="503", final=False, retry_at=later)
    v = verdict(claims=[claim(i) for i in range(11) if i != 3], records=[waiting])
    assert (fates(v)[3], v.slots[3].at) == ("retry_wait", later)
    assert v.slots[3].detail is not None and v.slots[3].detail.startswith("attempt 1 failed")
    assert v.findings == ()
    # Its retry came due and nobody ran it: a finding, not a fate.
    due = record(3, "failed", error="503", final=False, retry_at=SLOTS[3])
    v = verdict(claims=[claim(i) for i in range(11) if i != 3], records=[due])
    assert kinds(v) == ["unaccounted"]


def test_a_release_frees_a_given_up_slot() -> None:
    failed = record(3, "failed")
    rerun = claim(3, at=timedelta(seconds=5))
    v = verdict(
        claims=[*(claim(i) for i in range(11) if i != 3), rerun],
        records=[failed],
        releases=[release(3, timedelta(seconds=3))],
    )
    assert v.findings == ()
    v = verdict(
        claims=[claim(i) for i in range(11) if i != 3],
        records=[failed],
        releases=[release(3, timedelta(seconds=3))],
    )
    assert fates(v)[3] == "released"
    assert v.findings == ()


def test_a_released_slot_that_ran_keeps_its_history_and_is_never_before_the_job() -> None:
    """The slot ran, an operator released it: it is `released` with who ran it and who freed
    it, even before the job's recorded first appearance; run again, it is a run after a
    release, not a duplicate."""
    what = "released (ran at 2026-11-30T10:03:01+00:00 by r1)"
    freed = release(3, timedelta(seconds=30), what)
    ran = record(3, "ran", final=False)  # the attempt's record of its run
    later = SLOTS[5]
    v = verdict(
        claims=[claim(i) for i in range(4, 11)], records=[ran], releases=[freed], first_seen=later
    )
    assert fates(v)[3] == "released"
    assert v.slots[3].detail == (
        "released (ran at 2026-11-30T10:03:01+00:00 by r1) by ana@ops at "
        "2026-11-30T10:03:30+00:00 (wrong total)"
    )
    assert v.slots[3].by == "ana@ops"
    assert fates(v)[:3] == ["before_job"] * 3  # never tried, never freed
    again = claim(3, at=timedelta(minutes=1))
    v = verdict(
        claims=[again, *(claim(i) for i in range(4, 11))], releases=[freed], first_seen=later
    )
    assert fates(v)[3] == "ran"
    assert (v.slots[3].detail or "").startswith("again after released (ran at")
    assert v.findings == ()


def test_slots_inside_a_pause_are_paused_and_after_it_are_due_as_usual() -> None:
    pause = Pause("j", SLOTS[2] + timedelta(seconds=1), "ops", "deploy", SLOTS[5])
    v = verdict(claims=[claim(i) for i in (0, 1, 2, 6, 7, 8, 9, 10)], pauses=[pause])
    assert fates(v)[3:6] == ["paused", "paused", "unaccounted"]  # resumed_at itself is due
    assert kinds(v) == ["unaccounted"]
    open_pause = Pause("j", SLOTS[8] - timedelta(seconds=1), "ops", None)
    v = verdict(claims=[claim(i) for i in range(8)], pauses=[open_pause])
    assert fates(v)[8:11] == ["paused"] * 3
    assert v.slots[8].detail == "held: the pause is still open"
    assert v.findings == ()


def test_overlap_and_missed_notes_account_for_slots() -> None:
    overlap = record(2, "overlap", started_at=None)
    missed = record(4, "missed", rid=2, key=None, slot_last=SLOTS[6], error="catch_up")
    v = verdict(claims=[claim(i) for i in (0, 1, 3, 7, 8, 9, 10)], records=[overlap, missed])
    assert fates(v)[2:7] == ["overlap", "ran", "missed", "missed", "missed"]
    assert v.slots[5].detail == "catch_up"
    assert v.findings == ()


def test_a_running_attempt_accounts_for_its_slot_and_a_dead_one_does_not() -> None:
    others = [claim(i) for i in range(11) if i != 5]
    v = verdict(claims=others, records=[record(5, None, alive=True)])
    assert fates(v)[5] == "running"
    v = verdict(claims=others, records=[record(5, None, alive=False)])
    assert fates(v)[5] == "died"
    assert kinds(v) == ["died"]


def test_a_claim_under_a_key_the_key_function_no_longer_gives_is_a_finding() -> None:
    old = claim(2, key="old-key-2")
    v = verdict(claims=[*(claim(i) for i in range(11) if i != 2), old])
    assert fates(v)[2] == "ran"
    assert kinds(v) == ["key_changed"]
    assert v.findings[0].key == "old-key-2"
    v = verdict(claims=[*(claim(i) for i in range(11)), old])
    assert sorted(kinds(v)) == ["doubled", "key_changed"]


def test_a_slot_claimed_before_it_was_due_is_a_finding() -> None:
    early = claim(2, at=-timedelta(seconds=30))
    v = verdict(claims=[*(claim(i) for i in range(11) if i != 2), early])
    assert kinds(v) == ["early"]


def test_waiting_tasks_no_live_worker_can_run_are_findings() -> None:
    found = unrunnable_findings({"charge_v2": 3, "mail": 1})
    assert [f.message for f in found] == [
        "3 tasks 'charge_v2' wait and no live worker can run them (none registers that name)",
        "1 task 'mail' waits and no live worker can run them (none registers that name)",
    ]
    assert unrunnable_findings(None) == [] == unrunnable_findings({})


def test_the_summary_counts_fates_and_findings() -> None:
    v = verdict(claims=[claim(i) for i in range(10)])
    assert v.summary() == "j: 12 slots (10 ran, 1 not_due, 1 due): all accounted for"


def test_a_slot_waiting_for_its_retry_is_accounted_for() -> None:
    """A failed attempt under the job's retry policy holds its slot until `retry_at`."""
    later = SLOTS[3] + timedelta(hours=1)
    waiting = record(3, "failed", final=False, retry_at=later, error="503")
    v = verdict(claims=[claim(i) for i in range(11) if i != 3], records=[waiting])
    assert fates(v)[3] == "retry_wait"
    assert v.findings == ()
