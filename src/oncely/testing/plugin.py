"""oncely's pytest plugin (entry point `oncely.testing.plugin`): a real database and fakes.

Fixtures:
  oncely_db_url   a database with oncely's tables, an empty ledger and task queue: Postgres from
                  `--oncely-db-url` or $ONCELY_TEST_DB_URL, else a new SQLite file per test
  fake_provider   a FakeProvider in the test's tmp_path; child processes find it through
                  $ONCELY_FAKE_PROVIDER (`FakeProvider.from_env()`)
  frozen_clock    a FrozenClock installed for the test, frozen at the real time it started
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from .clock import FrozenClock
from .database import prepare_database
from .provider import ENV as PROVIDER_ENV
from .provider import FakeProvider

DB_URL_ENV = "ONCELY_TEST_DB_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("oncely")
    group.addoption(
        "--oncely-db-url",
        dest="oncely_db_url",
        default=None,
        help=(
            f"Postgres URL for oncely's test fixtures (or ${DB_URL_ENV}); "
            "default: a temporary SQLite file per test"
        ),
    )


def _run(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine to completion, even if this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    errors: list[BaseException] = []

    def runner() -> None:
        try:
            asyncio.run(coro)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=runner)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


@pytest.fixture
def oncely_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL with oncely's tables created and its ledger empty."""
    url = request.config.getoption("oncely_db_url") or os.environ.get(DB_URL_ENV)
    if not url:
        url = f"sqlite:///{tmp_path / 'oncely-test.db'}"
    _run(prepare_database(str(url)))
    return str(url)


@pytest.fixture
def fake_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeProvider:
    """A FakeProvider shared with the test's child processes."""
    provider = FakeProvider(tmp_path / "fake-provider.db")
    monkeypatch.setenv(PROVIDER_ENV, str(provider.path))
    return provider


@pytest.fixture
def frozen_clock() -> Iterator[FrozenClock]:
    """A FrozenClock oncely reads for the duration of the test."""
    with FrozenClock() as clock:
        yield clock
