"""What became of each slot, read in Chromium on a real `oncely web` process: a history
written by real `oncely run` / `oncely release` processes (a failed slot waiting for its
retry, one given up after its five attempts, one that ran and was released), then the
page's skip on purpose and its second run after a confirmation, each read back from the
database."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from tests.web.browser.conftest import VIEWPORT, Site, login
from tests.web.browser.test_browser_schedules import submit

pytestmark = pytest.mark.timeout(300)

RAW = ("no_worker", "before_job", "given_up", "timed_out", "not_due", "retry_wait")


def iso(t: Any) -> str:
    return str(t.isoformat(timespec="seconds"))


def fail(site: Site, job: str, slot: Any, times: int) -> None:
    site.execute("INSERT INTO script (slot, behaviour) VALUES (:s, 'fail')", s=slot.isoformat())
    for _ in range(times):
        done = site.oncely("run", job, "--now", slot.isoformat())
        assert done.returncode == 1, (done.stdout, done.stderr)


def row(page: Any, slot: Any) -> Any:
    return page.locator(f'[data-testid="slot-row"][data-slot="{iso(slot)}"]')


def test_each_slot_says_its_fate_and_a_released_slot_asks_before_a_second_run(
    site: Site, page: Any
) -> None:
    hour = site.db_now().replace(minute=0, second=0, microsecond=0)
    waiting, given_up, released = (hour - timedelta(hours=k) for k in (2, 3, 4))
    fail(site, "report", waiting, 1)
    fail(site, "report", given_up, 5)  # the default budget: 5 attempts
    site.ok("run", "nightly", "--now", released.isoformat())
    key = released.strftime("%Y-%m-%dT%H:%M:%SZ")
    site.ok("release", "nightly", key, "--reason", "re-send the report", "--actor", "bo@ops")

    login(page, site)
    page.goto(f"{site.url}/jobs/report?n=6")
    text = row(page, waiting).get_by_test_id("explain").inner_text()
    assert "waiting for retry at " in text and "(attempt 1 failed; 4 of 5 attempts left)" in text
    assert (
        row(page, waiting).get_by_test_id("slot-label").inner_text().strip() == "waiting for retry"
    )
    gave_up = row(page, given_up)
    assert gave_up.get_by_test_id("explain").inner_text().startswith("given up after 5 attempts")
    assert gave_up.get_by_test_id("run-slot").count() == 0
    assert gave_up.get_by_test_id("release").count() == 1
    gave_up.locator("input[name=reason]").fill("the report is re-sent by hand")
    submit(page, gave_up.get_by_test_id("skip"))
    assert "on purpose" in page.get_by_test_id("flash").inner_text()
    page.goto(f"{site.url}/jobs/report?n=6")
    assert (
        row(page, given_up)
        .get_by_test_id("explain")
        .inner_text()
        .startswith("skipped on purpose by web:token@127.0.0.1 at ")
    )
    shown = page.locator("main").inner_text()
    assert [w for w in RAW if w in shown] == [], shown

    page.goto(f"{site.url}/jobs/nightly?n=6")
    freed = row(page, released)
    assert re.fullmatch(
        r"ran at \S+ by \S+; released by bo@ops at \S+ \(re-send the report\): it may run again",
        freed.get_by_test_id("explain").inner_text(),
    )
    effects = "SELECT count(*) FROM effects WHERE job = 'nightly' AND slot = :s"
    assert site.scalar(effects, s=released.isoformat()) == 1
    submit(page, freed.get_by_test_id("run-slot"))
    confirm = page.get_by_test_id("run-confirm")
    assert "a second time" in confirm.inner_text()
    box = confirm.bounding_box()
    assert box is not None and box["y"] + box["height"] <= VIEWPORT["height"]  # in view
    assert page.evaluate("document.activeElement.dataset.testid") == "run-confirm"
    assert site.scalar(effects, s=released.isoformat()) == 1  # asked, not run
    submit(page, confirm.get_by_test_id("run-yes"))
    assert "ran 1" in page.get_by_test_id("flash").inner_text()
    assert site.scalar(effects, s=released.isoformat()) == 2
    actions = [a for (a,) in site.rows("SELECT action FROM oncely_audit ORDER BY id")]
    assert actions == ["release", "skip", "run_slot"]
