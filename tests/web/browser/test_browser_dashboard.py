"""The dashboard in Chromium, as an operator uses it, against a real `oncely web` process and
real `oncely worker` processes; every check of an effect reads the database."""

from __future__ import annotations

import json
import signal
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from tests.support import wait_until
from tests.web.browser.conftest import Site, login

pytestmark = pytest.mark.timeout(240)

STEP = timedelta(seconds=1)
"""One scheduling step of an every-second job: a slot a worker had already begun may start."""


def utc(value: Any) -> datetime:
    """A time read back with plain SQL (SQLite: naive UTC text) as an aware datetime."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def claimed_slots(site: Site, job: str) -> list[datetime]:
    rows = site.rows("SELECT scheduled_for FROM oncely_runs WHERE job = :j", j=job)
    return sorted(utc(r[0]) for r in rows)


def job_rows(page: Any) -> dict[str, str]:
    rows = page.get_by_test_id("job-row")
    return {
        rows.nth(i).get_attribute("data-job"): rows.nth(i).get_attribute("data-paused")
        for i in range(rows.count())
    }


def test_overview_lists_every_job_and_its_pause(site: Site, page: Any) -> None:
    page.goto(f"{site.url}/")
    assert job_rows(page) == {
        "beat": "false",
        "nightly": "false",
        "report": "false",
        "scripted": "false",
        "yearly": "false",
    }
    site.ok("pause", "nightly", "--reason", "maintenance", "--actor", "ops@test")
    page.reload()
    assert job_rows(page)["nightly"] == "true"
    row = page.locator('[data-testid="job-row"][data-job="nightly"]')
    assert "maintenance" in row.inner_text()
    row.get_by_role("link", name="nightly").click()
    page.wait_for_url(f"{site.url}/jobs/nightly")
    assert page.get_by_test_id("resume").count() == 0  # read-only: no button, and why
    assert "not logged in" in page.get_by_test_id("read-only").inner_text()
    login(page, site)
    page.goto(f"{site.url}/jobs/nightly")
    assert page.get_by_test_id("resume").count() == 1
    assert page.get_by_test_id("pause").count() == 0
    assert page.get_by_test_id("read-only").count() == 0


def test_pause_in_the_browser_stops_a_running_worker(site: Site, page: Any) -> None:
    worker = site.popen("worker", "--jobs", "beat", "--concurrency", "0", name="worker")
    wait_until(
        lambda: len(claimed_slots(site, "beat")) >= 2, "slots of beat from the worker", deadline=120
    )
    login(page, site)
    page.goto(f"{site.url}/jobs/beat")
    page.get_by_test_id("pause-form").locator("input[name=reason]").fill("bad deploy")
    page.get_by_test_id("pause").click()
    assert "pause" in page.get_by_test_id("flash").inner_text().lower()
    assert page.get_by_test_id("job-name").get_attribute("data-paused") == "true"
    rows = site.rows("SELECT paused_at, reason FROM oncely_pauses WHERE job = 'beat'")
    assert len(rows) == 1 and rows[0][1] == "bad deploy", rows
    paused_at = utc(rows[0][0])

    # Three more slots come due while paused: the worker, still alive, starts none of them.
    wait_until(lambda: site.db_now() > paused_at + 3.5 * STEP, "three slots of pause", deadline=30)
    during = [s for s in claimed_slots(site, "beat") if s > paused_at + STEP]
    assert during == [], during
    assert worker.poll() is None, site.log("worker")

    page.get_by_test_id("resume").click()
    assert page.get_by_test_id("job-name").get_attribute("data-paused") == "false"
    resumed_at = utc(site.scalar("SELECT resumed_at FROM oncely_pauses WHERE job = 'beat'"))
    wait_until(
        lambda: any(s > resumed_at for s in claimed_slots(site, "beat")),
        "beat after resume",
    )
    gap = [s for s in claimed_slots(site, "beat") if paused_at + STEP < s < resumed_at - STEP]
    assert gap == [], gap  # not caught up on resume
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, site.log("worker")
    actions = site.rows("SELECT action, actor FROM oncely_audit ORDER BY id")
    assert [a[0] for a in actions] == ["pause", "resume"], actions


RANGE_START = datetime(2026, 11, 29, 0, 0, tzinfo=timezone.utc)
RAN_BEFORE = [2, 7, 23]


def test_backfill_a_range_plan_then_apply(site: Site, page: Any) -> None:
    for hour in RAN_BEFORE:
        site.ok("run", "nightly", "--now", (RANGE_START + timedelta(hours=hour)).isoformat())
    login(page, site)
    page.goto(f"{site.url}/jobs/nightly")
    form = page.get_by_test_id("backfill-form")
    form.locator("input[name=start]").fill("2026-11-29T00:00:00Z")
    form.locator("input[name=end]").fill("2026-11-30T00:00:00Z")
    form.locator("[type=submit]").click()

    plan = page.get_by_test_id("backfill-plan")
    rows = plan.get_by_test_id("plan-row")
    rows.first.wait_for()  # the plan's page has loaded (count() does not wait)
    assert rows.count() == 24
    actions = [rows.nth(i).get_attribute("data-action") for i in range(24)]
    assert actions.count("would run") == 21, actions
    assert [i for i, a in enumerate(actions) if a == "already ran"] == RAN_BEFORE
    assert len(claimed_slots(site, "nightly")) == 3  # a plan changes nothing

    page.get_by_test_id("backfill-apply").click()
    page.get_by_test_id("flash").wait_for()
    assert page.get_by_test_id("flash").count() == 1
    claimed = claimed_slots(site, "nightly")
    assert claimed == [RANGE_START + timedelta(hours=h) for h in range(24)], claimed
    effects = site.rows("SELECT slot FROM effects WHERE job = 'nightly'")
    assert len(effects) == len({e[0] for e in effects}) == 24
    audit = site.rows("SELECT action, result FROM oncely_audit WHERE action = 'backfill'")
    assert audit == [("backfill", "ran 21")], audit


def enqueue(site: Site, task: str, **args: Any) -> int:
    out = site.ok("enqueue", task, "--json", json.dumps(args))  # "enqueued T id N queue Q"
    words = out.split()
    return int(words[words.index("id") + 1])


def test_filter_tasks_by_state_and_retry_a_dead_one(site: Site, page: Any) -> None:
    dead = enqueue(site, "send_receipt", order=-7)
    sent = [enqueue(site, "send_receipt", order=n) for n in (1, 2)]
    waiting = [enqueue(site, "resize_image", path=f"/img/{n}.png") for n in range(3)]
    worker = site.popen("worker", "--jobs", "yearly", "--queues", "mail", name="worker")

    def states() -> dict[int, str]:
        return {r[0]: r[1] for r in site.rows("SELECT id, state FROM oncely_tasks")}

    wait_until(
        lambda: [states()[i] for i in [dead, *sent]] == ["dead", "succeeded", "succeeded"],
        f"the mail tasks to finish: {states()}",
        deadline=120,
    )
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, site.log("worker")

    login(page, site)
    page.goto(f"{site.url}/tasks")
    assert page.get_by_test_id("task-row").count() == 6
    page.get_by_test_id("task-filter").locator("select[name=state]").select_option("dead")
    page.get_by_test_id("task-filter").locator("[type=submit]").click()
    page.wait_for_url("**/tasks?*state=dead*")
    rows = page.get_by_test_id("task-row")
    assert rows.count() == 1
    assert rows.first.get_attribute("data-task-id") == str(dead)
    assert rows.first.get_attribute("data-state") == "dead"

    page.get_by_test_id("task-filter").locator("select[name=state]").select_option("available")
    page.get_by_test_id("task-filter").locator("[type=submit]").click()
    page.wait_for_url("**/tasks?*state=available*")
    shown = {int(rows.nth(i).get_attribute("data-task-id")) for i in range(rows.count())}
    assert shown == set(waiting)

    page.goto(f"{site.url}/tasks?state=dead")
    rows.first.get_by_role("link", name=str(dead)).click()
    page.wait_for_url(f"{site.url}/tasks/{dead}")
    assert "the mail gateway refused order -7" in page.get_by_test_id("task-error").inner_text()
    page.get_by_test_id("retry").click()
    assert page.get_by_test_id("flash").count() == 1
    assert states()[dead] == "available"
    assert site.scalar("SELECT attempt FROM oncely_tasks WHERE id = :i", i=dead) == 0
    audit = site.rows("SELECT action, target FROM oncely_audit")
    assert audit == [("task_retry", f"task {dead}")], audit
