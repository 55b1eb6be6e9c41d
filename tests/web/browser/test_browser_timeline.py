"""A job's timeline in Chromium: a history written by real runs (`oncely run --now` of chosen
slots of the every-second job `scripted`, whose slots read what to do from the `script`
table), a real pause, then one mark counted per colour against what the database holds."""

from __future__ import annotations

import subprocess
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.support import wait_until
from tests.web.browser.conftest import Site, login
from tests.web.browser.test_browser_dashboard import utc

pytestmark = pytest.mark.timeout(240)

N = 300
"""Slots shown (`?n=`): five minutes of an every-second job, room for the whole test."""

RAN = [0, 1, 2, 3, 4]
FAILED = [10, 11]
TIMED_OUT = [20]
CANCELLED = [30]
RUNNING = [40]
"""Offsets in seconds from the history's first slot. Cancelled and running are Postgres's
alone: on SQLite the attempt holds the write lock from claim to commit, so no start is
recorded while it runs (it cannot be seen running, nor cancelled)."""


def run_slot(site: Site, slot: datetime, behaviour: str | None, expect: int) -> None:
    if behaviour is not None:
        site.execute(
            "INSERT INTO script (slot, behaviour) VALUES (:s, :b)", s=slot.isoformat(), b=behaviour
        )
    done = site.oncely("run", "scripted", "--now", slot.isoformat())
    assert done.returncode == expect, (slot, behaviour, done.stdout, done.stderr)


def start_hold(site: Site, slot: datetime, name: str) -> subprocess.Popen[str]:
    """A slot that runs until the test releases it (or cancels it)."""
    started = Path(f"{site.vars['ONCELY_TEST_HOLD']}.started")
    started.unlink(missing_ok=True)
    site.execute("INSERT INTO script (slot, behaviour) VALUES (:s, 'hold')", s=slot.isoformat())
    proc = site.popen("run", "scripted", "--now", slot.isoformat(), name=name)
    wait_until(started.exists, f"the held slot {slot} to start")
    # Postgres: the attempt records its start once it has run a second (runner.LISTEN_AFTER);
    # from then on it shows as running and can be cancelled.
    wait_until(
        lambda: site.scalar(
            "SELECT count(*) FROM oncely_attempts WHERE job = 'scripted' AND slot = :s"
            " AND outcome IS NULL",
            s=slot,
        ),
        f"the start record of {slot}",
    )
    return proc


def marks(page: Any) -> Counter[str]:
    found = page.get_by_test_id("slot-mark")
    outcomes = found.evaluate_all("els => els.map(e => e.dataset.outcome)")
    return Counter(outcomes)


def paused_slots(site: Site) -> int:
    """Whole seconds inside the (one, ended) pause of `scripted`: the slots it covered."""
    ((at, until),) = site.rows("SELECT paused_at, resumed_at FROM oncely_pauses")
    first, end = utc(at), utc(until)
    second = first.replace(microsecond=0) + (
        timedelta(seconds=1) if first.microsecond else timedelta()
    )
    count = 0
    while second < end:
        count, second = count + 1, second + timedelta(seconds=1)
    return count


def write_history(site: Site, page: Any) -> tuple[datetime, subprocess.Popen[str] | None]:
    """The scripted history; returns its first slot and the process holding the running one."""
    t0 = site.db_now().replace(microsecond=0) - timedelta(seconds=50)
    for offset in RAN:
        run_slot(site, t0 + timedelta(seconds=offset), None, 0)
    for offset in FAILED:
        run_slot(site, t0 + timedelta(seconds=offset), "fail", 1)
    for offset in TIMED_OUT:
        run_slot(site, t0 + timedelta(seconds=offset), "slow", 1)
    if site.postgres:  # SQLite refuses a cancel: the running attempt holds its write lock
        slot = t0 + timedelta(seconds=CANCELLED[0])
        held = start_hold(site, slot, "cancelled")
        login(page, site)
        page.goto(f"{site.url}/jobs/scripted?n={N}")
        row = page.locator('[data-testid="slot-row"][data-outcome="running"]')
        assert row.count() == 1
        row.get_by_test_id("cancel-slot").click()
        assert page.get_by_test_id("flash").count() == 1
        assert held.wait(timeout=60) == 1, site.log("cancelled")
    site.ok("pause", "scripted", "--reason", "a scripted pause")
    paused_at = utc(site.scalar("SELECT paused_at FROM oncely_pauses"))
    wait_until(
        lambda: site.db_now() > paused_at + timedelta(seconds=3), "three paused slots", deadline=30
    )
    site.ok("resume", "scripted")
    if not site.postgres:
        return t0, None
    return t0, start_hold(site, t0 + timedelta(seconds=RUNNING[0]), "running")


def test_timeline_shows_one_mark_per_slot_in_the_colour_of_its_outcome(
    site: Site, page: Any
) -> None:
    t0, running = write_history(site, page)
    page.goto(f"{site.url}/jobs/scripted?n={N}")
    shown = marks(page)
    (site.tmp / "release").touch()
    if running is not None:
        assert running.wait(timeout=60) == 0, site.log("running")

    expected = {
        "ran": len(RAN),
        "failed": len(FAILED),
        "timed_out": len(TIMED_OUT),
        "cancelled": len(CANCELLED) if site.postgres else 0,
        "paused": paused_slots(site),
        "running": len(RUNNING) if site.postgres else 0,
    }
    # Slots before the job first appeared are `before_job`; the rest that did not run: missed.
    expected["missed"] = N - sum(expected.values()) - shown.get("before_job", 0)
    assert {k: shown[k] for k in expected} == expected, shown
    assert sum(shown.values()) == N
    assert expected["paused"] >= 3

    # The marks sit on the slots the history wrote.
    def outcome_at(offset: int) -> str | None:
        slot = (t0 + timedelta(seconds=offset)).isoformat()
        mark = page.locator(f'[data-testid="slot-mark"][data-slot="{slot}"]')
        return mark.get_attribute("data-outcome") if mark.count() == 1 else f"{mark.count()} marks"

    assert [outcome_at(o) for o in RAN] == ["ran"] * len(RAN)
    assert [outcome_at(o) for o in FAILED] == ["failed"] * len(FAILED)
    assert outcome_at(TIMED_OUT[0]) == "timed_out"
    if site.postgres:
        assert outcome_at(CANCELLED[0]) == "cancelled"
        assert outcome_at(RUNNING[0]) == "running"
    runs = site.rows("SELECT count(*) FROM oncely_runs WHERE job = 'scripted'")
    # The held slot, released, is claimed too.
    assert runs[0][0] == len(RAN) + (1 if site.postgres else 0)
