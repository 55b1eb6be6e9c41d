"""Pointing an app at a test database, and getting one ready.

An app built on a URL is simply pointed at the test database. An app built on an engine
(`Oncely(engine)`, the pattern for sharing a FastAPI app's pool) keeps that engine: the app's
own code uses it too, so handing oncely a different database would make the test read one
database and oncely write another ("0 deliveries ran … skipped, skipped"). `using_database`
refuses that, naming both, and accepts the engine itself, or a URL of the same database.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from ..app import Database, Oncely
from ..errors import ConfigError


def _url_of(database: Database) -> URL | None:
    """The URL a database (URL, engine or sessionmaker) connects to; None if unknown."""
    if isinstance(database, str):
        return make_url(database)
    if isinstance(database, AsyncEngine):
        return database.url
    bind = database.kw.get("bind") if isinstance(database, async_sessionmaker) else None
    return bind.url if isinstance(bind, AsyncEngine) else None


def same_database(a: URL, b: URL) -> bool:
    """Whether two URLs name one database (drivers, passwords and query options aside)."""
    if a.get_backend_name() != b.get_backend_name():
        return False
    if a.get_backend_name() == "sqlite":
        path_a, path_b = a.database or "", b.database or ""
        if ":memory:" in (path_a, path_b) or not path_a or not path_b:
            return False
        return os.path.realpath(path_a) == os.path.realpath(path_b)
    return (a.host or "localhost", a.port or 5432, a.database, a.username) == (
        b.host or "localhost",
        b.port or 5432,
        b.database,
        b.username,
    )


def _shown(url: URL | None) -> str:
    return url.render_as_string(hide_password=True) if url is not None else "an unknown database"


@asynccontextmanager
async def using_database(app: Oncely, database: Database) -> AsyncIterator[Oncely]:
    """Point a (module-level) app at a test database for the block, then put it back.

    `database` is a URL, an AsyncEngine or an async_sessionmaker. An app built on an engine
    keeps it when `database` is a URL of that engine's database; a URL of another database
    raises ConfigError naming both (your code and oncely would use different databases):
    point your engine at the test database, or pass the engine you built on it. Closes the
    pool the app opened for the block (an engine you passed stays open). The schema is not
    created here: `await app.migrate()`, or use the `oncely_db_url` fixture.
    """
    current = app._database
    if isinstance(database, str) and not isinstance(current, str):
        theirs, ours = _url_of(current), make_url(database)
        if theirs is None or not same_database(theirs, ours):
            raise ConfigError(
                f"using_database: the app is built on an engine for {_shown(theirs)}, but the "
                f"test database is {_shown(ours)}: your code would use one and oncely the "
                "other. Build the engine on the test database and pass it, "
                "using_database(app, engine), or point your settings at the test database"
            )
        database = current  # the same database: keep the app's (and your code's) engine
    saved_database, saved_store = app._database, app._store
    app._database, app._store = database, None
    try:
        yield app
    finally:
        await app.aclose()
        app._database, app._store = saved_database, saved_store


async def prepare_database(database: Database | Oncely) -> None:
    """Create oncely's tables if missing and delete every claim and task (a clean ledger).

    `database` is a URL, an AsyncEngine or async_sessionmaker (left open), or an app: then
    the database that app uses, engine or URL.
    """
    target = database._database if isinstance(database, Oncely) else database
    app = Oncely(target)
    try:
        await app.migrate()
        await app.store.clear()
    finally:
        await app.aclose()
