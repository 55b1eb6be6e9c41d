"""Shared fixtures: real databases, one suite over SQLite and Postgres.

Postgres comes from $ONCELY_TEST_POSTGRES_URL (default: the local `postgres` user on
127.0.0.1:5432). Each pytest process creates its own database (`oncely_test_<pid>`) and
empties its `public` schema before every test, so tests never see each other's rows and
several pytest runs can share one server. With CI=true an unreachable Postgres fails the
run instead of skipping its tests.
"""

from __future__ import annotations

import asyncio.selector_events
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from tests.support import IN_CI

PG_ADMIN_URL = os.environ.get(
    "ONCELY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _sync_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg2").render_as_string(False)


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A private Postgres database for this pytest process, as a plain postgresql:// URL."""
    admin = sa.create_engine(
        _sync_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT", pool_pre_ping=True
    )
    name = f"oncely_test_{os.getpid()}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.OperationalError as exc:
        admin.dispose()
        message = f"Postgres is not reachable at {make_url(PG_ADMIN_URL)!r}: {exc.orig}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    url = make_url(PG_ADMIN_URL).set(drivername="postgresql", database=name)
    yield url.render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def _reset_postgres(url: str) -> None:
    engine = sa.create_engine(_sync_url(url), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database (no oncely tables yet), as a URL; once SQLite, once Postgres."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'oncely.db'}"
    url: str = request.getfixturevalue("postgres_database")
    _reset_postgres(url)
    return url


@pytest.fixture
def sync_engine(db_url: str) -> Iterator[sa.Engine]:
    """A plain synchronous engine on the test database, for checking effects directly."""
    parsed = make_url(db_url)
    if parsed.get_backend_name() == "postgresql":
        engine = sa.create_engine(_sync_url(db_url))
    else:
        engine = sa.create_engine(parsed.set(drivername="sqlite"))
    yield engine
    engine.dispose()


# oncely's own pytest plugin (also an entry point once installed; named after its module,
# so loading it both ways registers it once).
pytest_plugins = ["oncely.testing.plugin"]


@contextlib.contextmanager
def wire_messages(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The type byte of every message written to a socket while open (Postgres protocol:
    Q = simple query, P = parse, B = bind+execute): counts round trips, not times."""
    sent: list[bytes] = []
    transport = asyncio.selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
    write = transport.write

    def counting_write(self: Any, data: Any) -> None:
        sent.append(bytes(data[:1]))
        write(self, data)

    monkeypatch.setattr(transport, "write", counting_write)
    try:
        yield sent
    finally:
        monkeypatch.setattr(transport, "write", write)
