"""The admin's page of the jobs in code: each job's schedule in words, zone, next slot,
latest due slot and outcome, pause; pause and resume through oncely's audited methods,
for staff with the permission, behind Django's CSRF check."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from shop_helpers import count

PAGE = "/admin/oncely/codejob/"


@pytest.fixture
def settings_for(alias: str) -> Iterator[str]:
    from django.test import override_settings

    with override_settings(ONCELY={"APP": "shop.jobs:app", "DATABASE": alias}):
        yield alias


def _client(
    username: str, *, superuser: bool = True, staff: bool = True, csrf: bool = False
) -> Any:
    from django.contrib.auth.models import User
    from django.test import Client

    user, _ = User.objects.update_or_create(
        username=username, defaults={"is_staff": staff, "is_superuser": superuser}
    )
    user.user_permissions.clear()  # the users are shared by the tests (on "default")
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def _row(page: str, job: str) -> str:
    found = re.search(rf'<tr class="job" data-job="{job}">(.*?)</tr>', page, re.S)
    assert found, page
    return found.group(1)


def _cell(row: str, name: str) -> str:
    found = re.search(rf'<t[dh] class="{name}"[^>]*>(.*?)</t[dh]>', row, re.S)
    assert found, row
    return found.group(1).strip()


def test_the_jobs_page_lists_each_code_job_with_its_schedule_and_latest_outcome(
    settings_for: str,
) -> None:
    from oncely.contrib.django.operated import call

    result = call(lambda app: app.run("leaderboard_close"))
    assert result.status.value == "ran"
    page = _client("ops").get(PAGE)
    assert page.status_code == 200
    text = page.content.decode()
    close = _row(text, "leaderboard_close")
    assert _cell(close, "words") == "at 18:00 on Friday"
    assert _cell(close, "zone") == "America/Mexico_City"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT18:00:00-0[56]:00", _cell(close, "next"))
    assert _cell(close, "last") == result.slot.isoformat()
    assert _cell(close, "outcome") == "ran" and _cell(close, "paused") == "no"
    tick = _row(text, "tick")
    assert _cell(tick, "words") == "every second" and _cell(tick, "zone") == "UTC"
    assert _cell(tick, "outcome") != "ran"  # no worker ran it


def test_pause_and_resume_go_through_oncely_s_audited_methods(settings_for: str) -> None:
    alias = settings_for
    client = _client("ops")
    page = client.post(f"{PAGE}tick/pause/", {"reason": "maintenance"}, follow=True)
    assert page.status_code == 200 and b"Job tick paused" in page.content
    assert count(alias, "oncely_pauses", "WHERE job = 'tick' AND resumed_at IS NULL") == 1
    paused = _cell(_row(page.content.decode(), "tick"), "paused")
    assert paused.startswith("yes") and "django-admin:ops: maintenance" in paused
    again = client.post(f"{PAGE}tick/pause/", follow=True)  # refused by oncely, reported
    assert b"already paused" in again.content
    page = client.post(f"{PAGE}tick/resume/", follow=True)
    assert b"Job tick resumed" in page.content
    assert count(alias, "oncely_pauses", "WHERE resumed_at IS NULL") == 0
    audited = "WHERE actor = %s AND job = 'tick' AND action = %s AND result LIKE %s"
    assert count(alias, "oncely_audit", audited, ["django-admin:ops", "pause", "refused%"]) == 1
    done = "WHERE actor = %s AND job = 'tick' AND result NOT LIKE %s"
    assert count(alias, "oncely_audit", done, ["django-admin:ops", "refused%"]) == 2
    unknown = client.post(f"{PAGE}no_such_job/pause/", follow=True)
    assert b"no_such_job" in unknown.content and count(alias, "oncely_pauses") == 1


def test_the_page_is_for_staff_and_the_buttons_need_the_change_permission_and_csrf(
    settings_for: str,
) -> None:
    from django.contrib.auth.models import Permission, User

    alias = settings_for
    outsider = _client("visitor", superuser=False, staff=False)
    assert outsider.get(PAGE).status_code == 302  # to the admin's login
    assert outsider.post(f"{PAGE}tick/pause/").status_code == 302
    viewer = _client("viewer", superuser=False)
    assert viewer.get(PAGE).status_code == 403  # staff, without the permission
    User.objects.get(username="viewer").user_permissions.add(
        Permission.objects.get(codename="view_codejob")
    )
    page = viewer.get(PAGE)
    assert page.status_code == 200 and b'value="Pause"' not in page.content
    assert viewer.post(f"{PAGE}tick/pause/").status_code == 403
    ops = _client("ops")
    assert ops.get(f"{PAGE}tick/pause/").status_code == 405  # a GET changes nothing
    forged = _client("ops", csrf=True).post(f"{PAGE}tick/pause/")
    assert forged.status_code == 403  # no CSRF token
    assert count(alias, "oncely_pauses") == 0 and count(alias, "oncely_audit") == 0
