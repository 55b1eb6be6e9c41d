"""The admin's schedules in a real browser: `manage.py runserver` of the shop project in a
process of its own, Debian's Chromium driven by Playwright (launched by its path: no browser
download), as tests/web/browser does. A staff user logs in, adds a schedule, disables it and
runs its due slot once, through the admin's own forms (its CSRF tokens, its session).

Without Chromium or Playwright this test is skipped, and with CI=true it fails instead.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shop_helpers import backdate_schedule, count, manage
from tests.support import IN_CI

CHROMIUM = Path(os.environ.get("ONCELY_TEST_CHROMIUM", "/usr/bin/chromium"))
PASSWORD = "a-browser-pw-1"


def _unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _unavailable(f"playwright is not installed (the test extra has it): {exc}")
    if not CHROMIUM.exists():
        _unavailable(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)")
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield launched
        finally:
            launched.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(alias: str, django_project: dict[str, str]) -> Iterator[str]:
    """`manage.py runserver` on a free port, oncely on `alias`; its URL once it answers."""
    port = _free_port()
    proc = manage(django_project, alias, "runserver", f"127.0.0.1:{port}", "--noreload")
    url = f"http://localhost:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "runserver did not answer within 60 s"
            try:
                with urllib.request.urlopen(f"{url}/admin/login/", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.1)  # polling the server, with a deadline
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=30)


def _staff() -> None:
    from django.contrib.auth.models import User

    user, _ = User.objects.update_or_create(
        username="ops", defaults={"is_staff": True, "is_superuser": True}
    )
    user.set_password(PASSWORD)
    user.save()


def _act(tab: Any, name: str, action: str) -> str:
    tab.check(f'input[name="_selected_action"][value="{name}"]')
    tab.select_option('select[name="action"]', action)
    tab.click('button[name="index"]')
    tab.wait_for_selector(".messagelist")
    return str(tab.inner_text(".messagelist"))


def test_staff_add_a_schedule_disable_it_and_run_its_due_slot_once_in_chromium(
    alias: str, server: str, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Playwright's sync API keeps an event loop in this thread; Django's ORM refuses to run
    # under one unless told it is safe (it is: nothing else uses this thread's connections).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    _staff()
    tab = browser.new_page()
    tab.goto(f"{server}/admin/login/?next=/admin/")
    tab.fill("#id_username", "ops")
    tab.fill("#id_password", PASSWORD)
    tab.click('input[type="submit"]')
    tab.wait_for_url(f"{server}/admin/")

    tab.goto(f"{server}/admin/oncely/schedulerow/add/")
    tab.fill("#id_name", "acme_digest")
    tab.fill("#id_every", "1h")
    tab.fill("#id_tz", "Europe/Madrid")
    tab.select_option("#id_target", "job:digest")
    tab.fill("#id_args", '{"customer": "acme"}')
    tab.click('input[name="_save"]')
    tab.wait_for_selector(".messagelist")
    assert "was added successfully" in tab.inner_text(".messagelist")
    row = tab.inner_text("#result_list tbody tr")
    assert "acme_digest" in row and "every hour" in row and "Europe/Madrid" in row
    assert count(alias, "oncely_schedules", "WHERE name = 'acme_digest' AND state = 'active'") == 1

    assert "disabled" in _act(tab, "acme_digest", "disable")
    assert count(alias, "oncely_schedules", "WHERE state = 'paused'") == 1

    # Its first slot has not come due yet: nothing to run.
    assert "no slot of schedule" in _act(tab, "acme_digest", "run_due")
    # As if added a year ago: its latest hourly slot is due (a disabled schedule's slot
    # still runs by hand, as `app.schedules.run_due` allows).
    backdate_schedule(alias, "acme_digest")
    first = _act(tab, "acme_digest", "run_due")
    assert re.search(r"slot \S+ ran", first), first
    again = _act(tab, "acme_digest", "run_due")
    assert "already ran by" in again, again
    assert count(alias, "shop_bonus", "WHERE member = 'digest:acme'") == 1  # once
    audited = "WHERE actor = 'django-admin:ops' AND job = 'schedule:acme_digest'"
    assert count(alias, "oncely_audit", audited + " AND action IN ('add', 'pause')") == 2
