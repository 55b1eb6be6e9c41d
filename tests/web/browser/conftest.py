"""The dashboard in a real browser: a real `python -m oncely web` process on a free port of
127.0.0.1, over the dashboard test app on a fresh database (SQLite, Postgres), and Debian's
Chromium driven by Playwright for Python (launched by its path: no browser download).

Without Chromium or Playwright these tests are skipped, and with CI=true they fail instead.
A failed test leaves a screenshot of its page in its output folder (tmp_path, or
$ONCELY_TEST_SCREENSHOTS when set) and says where.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from tests.conftest import _reset_postgres
from tests.support import IN_CI, engine_for, run_cli, start_cli, wait_until

CHROMIUM = Path(os.environ.get("ONCELY_TEST_CHROMIUM", "/usr/bin/chromium"))
APP = "tests.apps.dashboard_app:app"
TOKEN = "browser-test-token"
VIEWPORT = {"width": 1280, "height": 800}


def _unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Site:
    """One test's database, the dashboard serving it, and the CLI on the same database."""

    db_url: str
    engine: sa.Engine
    tmp: Path
    vars: dict[str, str]
    url: str = ""
    server: subprocess.Popen[str] | None = None
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def postgres(self) -> bool:
        return self.db_url.startswith("postgres")

    def oncely(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`oncely ARGS` in a process of its own, on this database."""
        return run_cli(*args, env=self.vars, timeout=timeout)

    def ok(self, *args: str) -> str:
        done = self.oncely(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def popen(self, *args: str, name: str) -> subprocess.Popen[str]:
        """`oncely ARGS` in the background, its output in tmp/NAME.log; stopped at teardown."""
        proc = start_cli(*args, env=self.vars, log=self.tmp / f"{name}.log")
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()[-3000:]

    def rows(self, query: str, **params: Any) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.text(query), params).all())

    def scalar(self, query: str, **params: Any) -> Any:
        return self.rows(query, **params)[0][0]

    def execute(self, query: str, **params: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text(query), params)

    def db_now(self) -> datetime:
        if self.postgres:
            now: datetime = self.scalar("SELECT clock_timestamp()")
            return now.astimezone(timezone.utc)
        return datetime.now(timezone.utc)

    def start_server(self, *options: str) -> None:
        """`oncely web` on a free port of 127.0.0.1, ready once /healthz answers 200."""
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        args = ["web", "--host", "127.0.0.1", "--port", str(port), *options]
        self.server = self.popen(*args, name="web")
        wait_until(self._healthy, f"`oncely web` on {self.url}: {self.log('web')}")

    def _healthy(self) -> bool:
        assert self.server is not None
        if self.server.poll() is not None:
            raise AssertionError(f"`oncely web` exited {self.server.returncode}: {self.log('web')}")
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _site(db_url: str, tmp_path: Path) -> Site:
    site = Site(
        db_url=db_url,
        engine=engine_for(db_url),
        tmp=tmp_path,
        vars={
            "ONCELY_APP": APP,
            "ONCELY_DATABASE_URL": db_url,
            "ONCELY_TEST_HOLD": str(tmp_path / "release"),
        },
    )
    site.ok("migrate")
    from tests.apps.dashboard_app import TABLES

    with site.engine.begin() as conn:
        for statement in TABLES:
            conn.exec_driver_sql(statement)
    return site


def _served(url: str, tmp_path: Path) -> Iterator[Site]:
    s = _site(url, tmp_path)
    try:
        s.start_server("--allow-actions", "--token", TOKEN)
        yield s
    finally:
        (tmp_path / "release").touch()
        s.stop()
        s.engine.dispose()


@pytest.fixture
def site(db_url: str, tmp_path: Path) -> Iterator[Site]:
    """The dashboard test app migrated on an empty database (once SQLite, once Postgres),
    served by `oncely web` with actions allowed behind a token."""
    yield from _served(db_url, tmp_path)


@pytest.fixture
def pg_site(postgres_database: str, tmp_path: Path) -> Iterator[Site]:
    """The same on Postgres alone (cancelling a running slot needs its row locks)."""
    _reset_postgres(postgres_database)
    yield from _served(postgres_database, tmp_path)


@pytest.fixture
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, for one test.

    Not once per session: Playwright's sync API marks its event loop as running in this
    thread for as long as it lives, and every asyncio test after it would then fail
    ("Cannot run the event loop while another loop is running").
    """
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
    assert asyncio._get_running_loop() is None, "Playwright left its event loop running"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


_REPORTS = pytest.StashKey[dict[str, Any]]()


def screenshots_dir(tmp_path: Path) -> Path:
    base = os.environ.get("ONCELY_TEST_SCREENSHOTS")
    folder = Path(base) if base else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh browser page (its own cookies); a screenshot of it if the test failed."""
    context = browser.new_context(viewport=VIEWPORT)
    tab = context.new_page()
    tab.set_default_timeout(20_000)
    try:
        yield tab
    finally:
        reports = request.node.stash.get(_REPORTS, {})
        if any(r.failed for r in reports.values()):
            shot = screenshots_dir(tmp_path) / f"{request.node.name}.png"
            try:
                tab.screenshot(path=str(shot), full_page=True)
                sys.stderr.write(f"\nscreenshot of the failed page: {shot} ({tab.url})\n")
            except Exception as exc:  # the page may be gone with the failure
                sys.stderr.write(f"\nno screenshot of the failed page: {exc}\n")
        context.close()


def login(page: Any, site: Site, token: str = TOKEN) -> None:
    """Sign in through the login form; the session cookie lets the actions through."""
    page.goto(f"{site.url}/login")
    form = page.get_by_test_id("login")
    form.locator("input[name=token]").fill(token)
    form.locator("[type=submit]").click()
    page.wait_for_load_state()
