"""A data schedule made, paused and removed in Chromium, on a real `oncely web` process:
each step read back from the database (the schedule's row, its audit rows)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.web.browser.conftest import Site, login

pytestmark = pytest.mark.timeout(240)


def schedule(site: Site, name: str) -> list[Any]:
    return site.rows(
        "SELECT cron, every_seconds, tz, target_kind, target, args, state, pause_reason "
        "FROM oncely_schedules WHERE name = :n",
        n=name,
    )


def audit(site: Site) -> list[tuple[str, str, str]]:
    return [
        (r[0], r[1], r[2])
        for r in site.rows("SELECT action, job, actor FROM oncely_audit ORDER BY id")
    ]


def test_create_pause_and_remove_a_schedule_in_the_browser(site: Site, page: Any) -> None:
    page.goto(f"{site.url}/schedules")
    assert page.get_by_test_id("add-form").count() == 0  # read-only until logged in
    assert "not logged in" in page.get_by_test_id("read-only").inner_text()
    login(page, site)
    page.get_by_test_id("nav-schedules").click()
    page.wait_for_url(f"{site.url}/schedules")
    assert page.get_by_test_id("no-schedules").count() == 1

    form = page.get_by_test_id("add-form")
    form.get_by_test_id("field-name").fill("digest-acme")
    form.get_by_test_id("field-cron").fill("0 9 * * MON")
    form.get_by_test_id("field-tz").fill("Europe/Madrid")
    form.get_by_test_id("field-target").select_option("task:send_receipt")
    form.get_by_test_id("field-args").fill('{"order": 5}')
    form.get_by_test_id("add").click()
    page.wait_for_url(f"{site.url}/schedules/digest-acme")
    assert "added digest-acme" in page.get_by_test_id("flash").inner_text()
    assert (
        page.get_by_test_id("schedule-words").inner_text() == "at 09:00 on Monday (Europe/Madrid)"
    )
    ((cron, every, tz, kind, target, args, state, _reason),) = schedule(site, "digest-acme")
    assert (cron, every, tz, kind, target, state) == (
        "0 9 * * MON", None, "Europe/Madrid", "task", "send_receipt", "active"
    )  # fmt: skip
    assert '"order": 5' in args

    page.get_by_test_id("pause-form").locator("input[name=reason]").fill("customer on hold")
    page.get_by_test_id("pause").click()
    page.wait_for_url(f"{site.url}/schedules/digest-acme")
    assert "paused digest-acme" in page.get_by_test_id("flash").inner_text()
    assert page.get_by_test_id("schedule-name").get_attribute("data-state") == "paused"
    assert schedule(site, "digest-acme")[0][-2:] == ("paused", "customer on hold")

    page.get_by_test_id("nav-schedules").click()
    row = page.locator('[data-testid="schedule-row"][data-schedule="digest-acme"]')
    assert row.get_attribute("data-state") == "paused"
    row.get_by_test_id("schedule-link").click()
    page.wait_for_url(f"{site.url}/schedules/digest-acme")

    page.get_by_test_id("remove").click()
    confirm = page.get_by_test_id("remove-confirm")
    assert "Remove the schedule digest-acme?" in confirm.inner_text()
    assert len(schedule(site, "digest-acme")) == 1  # asked, not removed
    confirm.get_by_test_id("remove-yes").click()
    page.wait_for_url(f"{site.url}/schedules")
    assert "removed digest-acme" in page.get_by_test_id("flash").inner_text()
    assert page.get_by_test_id("no-schedules").count() == 1
    assert schedule(site, "digest-acme") == []
    actor = "web:token@127.0.0.1"
    assert [a for a in audit(site) if a[1] == "schedule:digest-acme"] == [
        ("add", "schedule:digest-acme", actor),
        ("pause", "schedule:digest-acme", actor),
        ("remove", "schedule:digest-acme", actor),
    ]
