"""The admin's read-only pages for slot claims and tasks, and its retry / discard actions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from shop_helpers import count

STAFF = "ops"


@pytest.fixture
def staff(alias: str) -> Iterator[Any]:
    """A logged-in superuser's test client, with ONCELY["DATABASE"] = the test's alias."""
    from django.contrib.auth.models import User
    from django.test import Client, override_settings

    user, _ = User.objects.get_or_create(username=STAFF, is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    with override_settings(ONCELY={"APP": "shop.jobs:app", "DATABASE": alias}):
        yield client


TRACEBACK = """GatewayTimeout: 504
Traceback (most recent call last):
  File "shop/tasks.py", line 36, in send_receipt
    raise GatewayTimeout("504")
shop.tasks.GatewayTimeout: 504"""


def _dead_task(alias: str) -> int:
    from django.db import connections, transaction
    from shop.tasks import send_receipt

    from oncely.contrib.django import claim

    with transaction.atomic(using=alias):
        claim("leaderboard_close", "2026-06-06T00:00:00Z", using=alias)
    result = send_receipt.using(backend=alias).enqueue(11)
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "UPDATE oncely_tasks SET state = 'dead', attempt = 25, error = %s WHERE id = %s",
            [TRACEBACK, int(result.id)],
        )
    return int(result.id)


def _history(alias: str, task_id: int) -> None:
    """Two failed attempts of the task in oncely_task_errors, as the worker records them."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        for attempt, error in ((1, "ConnectionError: reset by peer"), (2, TRACEBACK)):
            cursor.execute(
                "INSERT INTO oncely_task_errors (task_id, attempt, error, by, at)"
                " VALUES (%s, %s, %s, %s, %s)",
                [task_id, attempt, error, f"worker-{attempt}", f"2026-06-06 00:0{attempt}:00"],
            )


def test_the_admin_pages_render_the_claims_and_the_tasks(alias: str, staff: Any) -> None:
    task_id = _dead_task(alias)
    claims = staff.get("/admin/oncely/slotclaim/")
    assert claims.status_code == 200
    assert b"leaderboard_close" in claims.content and b"2026-06-06T00:00:00Z" in claims.content
    tasks = staff.get("/admin/oncely/taskrow/")
    assert tasks.status_code == 200
    assert b"shop.tasks.send_receipt" in tasks.content and b"GatewayTimeout: 504" in tasks.content
    assert b"Traceback" not in tasks.content  # the list shows the error's first line only
    detail = staff.get(f"/admin/oncely/taskrow/{task_id}/change/")
    assert detail.status_code == 200 and b"dead" in detail.content
    assert b"Traceback (most recent call last)" in detail.content  # the whole error
    assert staff.get("/admin/oncely/taskrow/add/").status_code == 403  # read-only


def test_a_task_s_page_shows_every_attempt_s_error(alias: str, staff: Any) -> None:
    task_id = _dead_task(alias)
    _history(alias, task_id)
    detail = staff.get(f"/admin/oncely/taskrow/{task_id}/change/")
    page = detail.content.decode()
    assert detail.status_code == 200
    first, second = page.index("<b>attempt 1</b> on worker-1"), page.index("<b>attempt 2</b>")
    assert first < second  # oldest first
    assert "ConnectionError: reset by peer" in page[first:second]
    assert "Traceback (most recent call last)" in page[second:]


def test_slot_times_are_shown_in_the_job_s_zone(alias: str, staff: Any) -> None:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(
            "INSERT INTO oncely_runs (job, key, scheduled_for, claimed_at, claimed_by)"
            " VALUES (%s, %s, %s, %s, %s)",
            [
                "leaderboard_close",
                "2026-06-06T00:00:00Z",
                "2026-06-06 00:00:00",
                "2026-06-06 00:00:01",
                "vm:1",
            ],
        )
    page = staff.get("/admin/oncely/slotclaim/").content.decode()
    # Friday 18:00 in Mexico City, as the job's schedule says, not Saturday 00:00 UTC.
    assert "2026-06-05T18:00:00-06:00 America/Mexico_City" in page, page


def _act(staff: Any, action: str, task_id: int) -> Any:
    return staff.post(
        "/admin/oncely/taskrow/",
        {"action": action, "_selected_action": [str(task_id)]},
        follow=True,
    )


def test_retry_and_discard_act_like_the_cli(alias: str, staff: Any) -> None:
    task_id = _dead_task(alias)
    page = _act(staff, "retry", task_id)
    assert page.status_code == 200 and b"is available again" in page.content
    assert count(alias, "oncely_tasks", "WHERE state = 'available' AND attempt = 0") == 1
    page = _act(staff, "discard", task_id)
    assert b"discarded" in page.content
    assert count(alias, "oncely_tasks", "WHERE state = 'discarded'") == 1
    _act(staff, "retry", task_id)  # a discarded task can be retried, as with the CLI
    assert count(alias, "oncely_tasks", "WHERE state = 'available'") == 1
    # Audited like the CLI's, with the staff user as the actor.
    audited = "WHERE actor = %s AND action IN ('task_retry', 'task_discard')"
    assert count(alias, "oncely_audit", audited, [f"django-admin:{STAFF}"]) == 3


def test_an_action_the_task_state_refuses_is_reported_and_changes_nothing(
    alias: str, staff: Any
) -> None:
    from django.db import connections

    task_id = _dead_task(alias)
    with connections[alias].cursor() as cursor:
        cursor.execute("UPDATE oncely_tasks SET state = 'succeeded' WHERE id = %s", [task_id])
    page = _act(staff, "discard", task_id)
    assert b"only available, running or dead tasks can be discarded" in page.content
    assert count(alias, "oncely_tasks", "WHERE state = 'succeeded'") == 1
