"""The admin's schedules kept as data: the list, add, edit, enable, disable, delete and "run
the due slot now" (once), each write through `app.schedules` (checked, audited)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from shop_helpers import backdate_schedule, count

LIST = "/admin/oncely/schedulerow/"
ACTOR = "django-admin:ops"


@pytest.fixture
def staff(alias: str) -> Iterator[Any]:
    from django.contrib.auth.models import User
    from django.test import Client, override_settings

    user, _ = User.objects.update_or_create(
        username="ops", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    with override_settings(ONCELY={"APP": "shop.jobs:app", "DATABASE": alias}):
        yield client


def _add(staff: Any, **fields: str) -> Any:
    form = {
        "name": "acme_digest",
        "cron": "0 9 * * *",
        "every": "",
        "tz": "Europe/Madrid",
        "target": "job:digest",
        "args": '{"customer": "acme"}',
        "catch_up": "latest",
        "grace": "",
        "overlap": "skip",
        "timeout": "",
        "enabled": "on",
        **fields,
    }
    return staff.post(f"{LIST}add/", form, follow=True)


def _act(staff: Any, action: str, *names: str) -> str:
    page = staff.post(LIST, {"action": action, "_selected_action": list(names)}, follow=True)
    assert page.status_code == 200
    return str(page.content.decode())


def _audited(alias: str, action: str) -> int:
    where = "WHERE actor = %s AND action = %s AND job = %s AND result NOT LIKE %s"
    return count(alias, "oncely_audit", where, [ACTOR, action, "schedule:acme_digest", "refused%"])


def test_a_schedule_added_in_the_admin_is_listed_in_words_with_its_zone(
    alias: str, staff: Any
) -> None:
    page = _add(staff)
    assert page.status_code == 200 and b"was added successfully" in page.content
    assert count(alias, "oncely_schedules", "WHERE name = 'acme_digest' AND state = 'active'") == 1
    assert _audited(alias, "add") == 1
    text = staff.get(LIST).content.decode()
    row = re.search(r"<tr>.*?acme_digest.*?</tr>", text, re.S)
    assert row, text
    assert "every day at 09:00 (Europe/Madrid)" in row.group(0)
    assert "job digest" in row.group(0)
    assert re.search(r"\d{4}-\d\d-\d\dT09:00:00\+0[12]:00", row.group(0))  # next, Madrid time
    assert 'alt="True"' in row.group(0)  # enabled


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"cron": "61 9 * * *"}, "cron"),
        ({"tz": "Mars/Olympus"}, "Mars/Olympus"),
        ({"args": '{"customer": "acme", "nope": 1}'}, "cannot take these arguments"),
        ({"args": "not json"}, "not JSON"),
        ({"cron": "", "every": "0s"}, "every"),
        ({"name": "tick"}, "name of a job in the code"),
    ],
)
def test_bad_input_is_the_form_s_error_and_writes_nothing(
    alias: str, staff: Any, fields: dict[str, str], error: str
) -> None:
    page = _add(staff, **fields)
    assert page.status_code == 200 and b"was added successfully" not in page.content
    assert error in page.content.decode()
    assert count(alias, "oncely_schedules") == 0
    assert count(alias, "oncely_audit", "WHERE action = 'add'") == 0


def test_edit_disable_enable_and_delete_go_through_app_schedules(alias: str, staff: Any) -> None:
    _add(staff)
    edit = staff.get(f"{LIST}acme_digest/change/")
    assert edit.status_code == 200 and b"Europe/Madrid" in edit.content
    version = re.search(rb'name="version" value="(\d+)"', edit.content)
    assert version
    form = {
        "name": "acme_digest",
        "cron": "",
        "every": "15m",
        "tz": "Europe/Madrid",
        "target": "job:digest",
        "args": '{"customer": "acme"}',
        "catch_up": "latest",
        "overlap": "skip",
        "enabled": "on",
        "version": version.group(1).decode(),
    }
    page = staff.post(f"{LIST}acme_digest/change/", form, follow=True)
    assert b"was changed successfully" in page.content, page.content.decode()[-3000:]
    assert count(alias, "oncely_schedules", "WHERE every_seconds = 900 AND cron IS NULL") == 1
    stale = staff.post(f"{LIST}acme_digest/change/", {**form, "every": "5m"}, follow=True)
    assert b"was changed since" in stale.content  # the form's version is old: refused
    assert count(alias, "oncely_schedules", "WHERE every_seconds = 900") == 1
    assert "disabled" in _act(staff, "disable", "acme_digest")
    assert count(alias, "oncely_schedules", "WHERE state = 'paused'") == 1
    assert "enabled, next slot" in _act(staff, "enable", "acme_digest")
    assert count(alias, "oncely_schedules", "WHERE state = 'active'") == 1
    for action in ("update", "pause", "resume"):
        assert _audited(alias, action) == 1, action
    staff.post(f"{LIST}acme_digest/delete/", {"post": "yes"}, follow=True)
    assert count(alias, "oncely_schedules") == 0 and _audited(alias, "remove") == 1


def test_run_the_due_slot_now_runs_it_once(alias: str, staff: Any) -> None:
    _add(staff, name="acme_digest", cron="", every="1h")
    assert "no slot of schedule" in _act(staff, "run_due", "acme_digest")  # none due yet
    assert count(alias, "shop_bonus") == 0
    backdate_schedule(alias, "acme_digest")  # a slot has come due since it was added
    first = _act(staff, "run_due", "acme_digest")
    assert re.search(r"Schedule acme_digest: slot \S+ ran", first), first
    again = _act(staff, "run_due", "acme_digest")
    assert "already ran by" in again and "it did not run again" in again
    assert count(alias, "shop_bonus", "WHERE member = 'digest:acme'") == 1  # once
    assert count(alias, "oncely_runs", "WHERE job = 'schedule:acme_digest'") == 1
    listed = staff.get(LIST).content.decode()
    assert re.search(r'field-last_run">\S+\+0[12]:00 ran on ', listed)  # the last run
    assert re.search(r'field-latest_slot">\S+\+0[12]:00 ran<', listed)
    # Every second now: its latest due slot did not run; its last run is still the one above.
    from oncely.contrib.django.operated import operated_app

    operated_app().schedules.update_sync("acme_digest", every="1s", by="tests")
    listed = staff.get(LIST).content.decode()
    assert re.search(r'field-last_run">\S+\+0[12]:00 ran on ', listed), listed
    assert re.search(r'field-latest_slot">\S+\+0[12]:00 not run<', listed), listed


def test_a_schedule_runs_a_django_task_enqueued_with_its_slot_once(
    alias: str, staff: Any, django_project: dict[str, str]
) -> None:
    import signal

    from shop_helpers import manage

    fields = {"cron": "", "every": "1h", "target": "task:shop.tasks.send_receipt"}
    bad = _add(staff, **fields, args='{"order": 5}')
    assert b"cannot take these arguments" in bad.content and count(alias, "oncely_schedules") == 0
    page = _add(staff, **fields, args=f'{{"order_id": 5, "using": "{alias}"}}')
    assert b"was added successfully" in page.content
    backdate_schedule(alias, "acme_digest")
    assert "ran" in _act(staff, "run_due", "acme_digest")
    assert "already ran" in _act(staff, "run_due", "acme_digest")
    where = "WHERE task = 'shop.tasks.send_receipt' AND idempotency_key LIKE %s"
    keyed = ["schedule:acme_digest:%"]
    assert count(alias, "oncely_tasks", where, keyed) == 1  # enqueued with the slot's claim, once
    worker = manage(
        django_project,
        alias,
        "oncely",
        "--app",
        "oncely.contrib.django.settings_app:app",
        "worker",
    )
    try:
        deadline = time.monotonic() + 90
        while count(alias, "oncely_tasks", "WHERE state = 'succeeded'") == 0:
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the task did not run within 90 s"
            time.sleep(0.1)  # polling the row, with a deadline
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)
    assert count(alias, "shop_receipt", "WHERE order_id = 5") == 1


def test_a_failed_slot_is_reported_and_listed_with_its_outcome(alias: str, staff: Any) -> None:
    _add(staff, cron="", every="1h", args='{"customer": "gone"}')
    backdate_schedule(alias, "acme_digest")
    first = _act(staff, "run_due", "acme_digest")
    assert "did not run (failed: LookupError: customer gone is gone)" in first, first
    assert count(alias, "shop_bonus") == 0  # its work rolled back
    listed = staff.get(LIST).content.decode()
    latest = re.search(r'<td class="field-latest_slot">([^<]*)</td>', listed)
    assert latest and re.fullmatch(r"\S+\+0[12]:00 failed", latest.group(1)), latest
    last = re.search(r'<td class="field-last_run">([^<]*)</td>', listed)
    assert last and last.group(1) == "-"  # no slot of it ran


def test_the_worker_runs_a_schedule_added_in_the_admin_each_slot_once_on_the_orm(
    alias: str, staff: Any, django_project: dict[str, str]
) -> None:
    import signal

    from shop_helpers import manage

    page = _add(staff, cron="", every="1s")
    assert b"was added successfully" in page.content
    worker = manage(django_project, alias, "oncely", "worker")
    mine = "WHERE member = 'digest:acme'"
    try:
        deadline = time.monotonic() + 90
        while count(alias, "shop_bonus", mine) < 3:
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "three slots did not run within 90 s"
            time.sleep(0.1)  # polling the rows, with a deadline
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, (out, err)
    ran = count(alias, "oncely_runs", "WHERE job = 'schedule:acme_digest'")
    assert count(alias, "shop_bonus", mine) == ran >= 3  # each slot's ORM work with its claim
    distinct = f"(SELECT DISTINCT week FROM shop_bonus {mine}) AS slots"
    assert count(alias, distinct) == ran  # one per slot
