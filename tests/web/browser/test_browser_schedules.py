"""A data schedule made, paused and removed in Chromium, on a real `oncely web` process:
each step read back from the database (the schedule's row, its audit rows)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any

import pytest
from tests.support import wait_until
from tests.web.browser.conftest import VIEWPORT, Site, login
from tests.web.browser.test_browser_dashboard import utc

pytestmark = pytest.mark.timeout(240)


def schedule(site: Site, name: str) -> list[Any]:
    return site.rows(
        "SELECT cron, every_seconds, tz, target_kind, target, args, state, pause_reason "
        "FROM oncely_schedules WHERE name = :n",
        n=name,
    )


def as_json(value: Any) -> Any:
    """A JSON column as read back: text (SQLite) or already decoded (Postgres)."""
    return json.loads(value) if isinstance(value, str) else value


def audit(site: Site) -> list[tuple[str, str, str]]:
    return [
        (r[0], r[1], r[2])
        for r in site.rows("SELECT action, job, actor FROM oncely_audit ORDER BY id")
    ]


def submit(page: Any, button: Any) -> None:
    """Click a button or link and wait for the page it leads to (a click does not wait: the
    next read could find the page it left)."""
    with page.expect_navigation():
        button.click()


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
    submit(page, form.get_by_test_id("add"))
    assert page.url == f"{site.url}/schedules/digest-acme"
    assert "added digest-acme" in page.get_by_test_id("flash").inner_text()
    assert (
        page.get_by_test_id("schedule-words").inner_text() == "at 09:00 on Monday (Europe/Madrid)"
    )
    ((cron, every, tz, kind, target, args, state, _reason),) = schedule(site, "digest-acme")
    assert (cron, every, tz, kind, target, state) == (
        "0 9 * * MON", None, "Europe/Madrid", "task", "send_receipt", "active"
    )  # fmt: skip
    assert as_json(args) == {"order": 5}

    page.get_by_test_id("pause-form").locator("input[name=reason]").fill("customer on hold")
    submit(page, page.get_by_test_id("pause"))
    assert "paused digest-acme" in page.get_by_test_id("flash").inner_text()
    assert page.get_by_test_id("schedule-name").get_attribute("data-state") == "paused"
    assert schedule(site, "digest-acme")[0][-2:] == ("paused", "customer on hold")

    submit(page, page.get_by_test_id("nav-schedules"))
    row = page.locator('[data-testid="schedule-row"][data-schedule="digest-acme"]')
    assert row.get_attribute("data-state") == "paused"
    row.get_by_test_id("schedule-link").click()
    page.wait_for_url(f"{site.url}/schedules/digest-acme")

    submit(page, page.get_by_test_id("remove"))
    confirm = page.get_by_test_id("remove-confirm")
    assert "Remove the schedule digest-acme?" in confirm.inner_text()
    assert len(schedule(site, "digest-acme")) == 1  # asked, not removed
    submit(page, confirm.get_by_test_id("remove-yes"))
    assert page.url == f"{site.url}/schedules"
    assert "removed digest-acme" in page.get_by_test_id("flash").inner_text()
    assert page.get_by_test_id("no-schedules").count() == 1
    assert schedule(site, "digest-acme") == []
    actor = "web:token@127.0.0.1"
    assert [a for a in audit(site) if a[1] == "schedule:digest-acme"] == [
        ("add", "schedule:digest-acme", actor),
        ("pause", "schedule:digest-acme", actor),
        ("remove", "schedule:digest-acme", actor),
    ]


def run_due(page: Any) -> str:
    """Click "Run the due slot now" and read the message of the page it leads to (the click
    does not wait for that page: a second click could land on this one)."""
    submit(page, page.get_by_test_id("run-due"))
    return str(page.get_by_test_id("flash").inner_text())


def test_the_due_slot_run_twice_from_the_browser_runs_once(site: Site, page: Any) -> None:
    login(page, site)
    page.goto(f"{site.url}/schedules")
    form = page.get_by_test_id("add-form")
    form.get_by_test_id("field-name").fill("crm-sync")
    form.get_by_test_id("field-every").fill("10s")
    form.get_by_test_id("field-target").select_option("task:sync_crm")
    form.get_by_test_id("field-args").fill('{"account": 9}')
    submit(page, form.get_by_test_id("add"))
    assert page.url == f"{site.url}/schedules/crm-sync"
    first = utc(site.scalar("SELECT next_slot FROM oncely_schedules WHERE name = 'crm-sync'"))
    wait_until(lambda: site.db_now() >= first, "the first slot of crm-sync comes due", deadline=40)

    first_run, second_run = run_due(page), run_due(page)
    slots = [re.findall(r" slot (\S+): (.*)", text)[0] for text in (first_run, second_run)]
    assert slots[0][1] == "ran", first_run
    if slots[1][0] == slots[0][0]:  # the same slot again: not run twice
        assert slots[1][1].startswith("skipped (already ran"), second_run
    else:  # the next slot came due between the clicks (every 10 s): that one ran
        assert slots[1][1] == "ran", second_run
    ran = {slot for slot, _ in slots}
    claims = site.rows("SELECT key FROM oncely_runs WHERE job = 'schedule:crm-sync'")
    tasks = site.rows("SELECT args FROM oncely_tasks WHERE task = 'sync_crm'")
    assert len(claims) == len(tasks) == len(ran), (claims, tasks, slots)  # one task per slot
    assert [as_json(args) for (args,) in tasks] == [{"account": 9}] * len(tasks)
    page.reload()
    assert page.get_by_test_id("slot-mark").count() >= 1


def add_schedules(site: Site, n: int) -> None:
    """`n` schedules (`s000`, `s001`, …) through the public API, on one event loop in a
    thread of its own (Playwright's loop holds this thread)."""
    from oncely import Oncely

    async def go() -> None:
        app = Oncely(site.db_url)
        app.task(name="sync_crm")(_nothing)
        try:
            for i in range(n):
                await app.schedules.add(f"s{i:03d}", every=3600, task="sync_crm")
        finally:
            await app.aclose()

    failed: list[BaseException] = []

    def thread() -> None:
        try:
            asyncio.run(go())
        except BaseException as exc:  # raised again in the test's thread
            failed.append(exc)

    worker = threading.Thread(target=thread)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive() and not failed, failed


async def _nothing(db: Any, account: int = 0) -> None:
    pass


def test_a_bad_schedule_added_below_a_long_list_shows_its_error_at_the_top(
    site: Site, page: Any
) -> None:
    """The list page is thousands of px tall with 100 schedules: the error of a refused add is at
    the top of the page, in view without scrolling, focused and announced (role=alert); the
    form keeps what was sent and the list stays on its page."""
    add_schedules(site, 160)
    login(page, site)
    page.goto(f"{site.url}/schedules?after=s049")
    assert page.evaluate("document.body.scrollHeight") > 3 * VIEWPORT["height"]
    form = page.get_by_test_id("add-form")
    form.get_by_test_id("field-name").fill("bad-one")
    form.get_by_test_id("field-cron").fill("61 * * * *")
    form.get_by_test_id("field-target").select_option("task:sync_crm")
    with page.expect_navigation() as landed:
        form.get_by_test_id("add").click()
    assert landed.value.status == 400
    shown = page.get_by_test_id("error")
    assert "61 * * * *" in shown.inner_text() and "nothing changed" in shown.inner_text()
    assert shown.get_attribute("role") == "alert"
    assert page.evaluate("window.scrollY") == 0
    box = shown.bounding_box()
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= VIEWPORT["height"]
    assert page.evaluate("document.activeElement.dataset.testid") == "error"
    form = page.get_by_test_id("add-form")
    assert form.get_by_test_id("field-name").input_value() == "bad-one"
    assert form.get_by_test_id("field-cron").input_value() == "61 * * * *"
    names = page.get_by_test_id("schedule-link").all_inner_texts()
    assert names[0] == "s050" and len(names) == 100  # the page it was on
    assert site.rows("SELECT name FROM oncely_schedules WHERE name = 'bad-one'") == []
    assert [a for a in audit(site) if a[0] != "add" or a[1] == "schedule:bad-one"] == []
