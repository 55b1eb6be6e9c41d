"""Shared by the dashboard's tests: the web test app on the test database (once SQLite,
once Postgres), a client that speaks to the dashboard's ASGI app in this process (httpx's
ASGI transport: real requests, real cookies, no server), and the rows the tests count."""

from __future__ import annotations

import html as html_lib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from tests.apps.web_app import build
from tests.support import engine_for, snapshot

from oncely import Oncely
from oncely.web import dashboard

HOUR = timedelta(hours=1)


@dataclass
class Board:
    """A browser-like client of one dashboard: it keeps cookies and fills in the CSRF token."""

    client: httpx.AsyncClient
    prefix: str = ""

    async def get(self, path: str, **params: Any) -> httpx.Response:
        return await self.client.get(self.prefix + path, params=params or None)

    async def csrf(self) -> str:
        """The CSRF token the dashboard's forms carry now (bound to this client's session)."""
        m = re.search(r'name="csrf" value="([^"]+)"', (await self.get("/login")).text)
        return m.group(1) if m else ""

    async def post(self, path: str, *, with_csrf: bool = True, **data: Any) -> httpx.Response:
        """POST a form, with the CSRF token of the page's forms (read from the login page)."""
        if with_csrf:
            data.setdefault("csrf", await self.csrf())
        return await self.client.post(self.prefix + path, data=data)


@dataclass
class Web:
    """One test's app, database and dashboards."""

    app: Oncely
    db_url: str
    engine: sa.Engine
    clients: list[httpx.AsyncClient]

    def rows(self, query: str, **params: Any) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.text(query), params).all())

    def snapshot(self) -> dict[str, list[Any]]:
        return snapshot(self.db_url)

    def audit(self) -> list[Any]:
        return self.rows("SELECT action, target, actor, result FROM oncely_audit ORDER BY id")

    def board(
        self, *, prefix: str = "", headers: dict[str, str] | None = None, **options: Any
    ) -> Board:
        """A client of `dashboard(app, **options)` (mounted under `prefix`, if given)."""
        asgi: Any = dashboard(self.app, **options)
        if prefix:
            from starlette.applications import Starlette
            from starlette.routing import Mount

            asgi = Starlette(routes=[Mount(prefix, app=asgi)])
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=asgi), base_url="http://dash", headers=headers
        )
        self.clients.append(client)
        return Board(client, prefix)

    def twin(self, board: Board) -> Board:
        """Another browser (its own cookies) on the same dashboard as `board`."""
        transport = board.client._transport
        client = httpx.AsyncClient(transport=transport, base_url="http://dash")
        self.clients.append(client)
        return Board(client, board.prefix)

    def now(self) -> datetime:
        if self.db_url.startswith("postgres"):
            return self.rows("SELECT clock_timestamp()")[0][0]  # type: ignore[no-any-return]
        return datetime.now(timezone.utc)

    def last_hour(self, back: int = 0) -> datetime:
        """The start of the hour `back` hours before the current one (UTC)."""
        now = self.now().astimezone(timezone.utc)
        return now.replace(minute=0, second=0, microsecond=0) - back * HOUR


@pytest.fixture
async def web(db_url: str) -> AsyncIterator[Web]:
    """The web test app, migrated, on an empty test database."""
    app = build(db_url)
    await app.migrate()
    engine = engine_for(db_url)
    w = Web(app, db_url, engine, [])
    yield w
    for client in w.clients:
        await client.aclose()
    await app.aclose()
    engine.dispose()


def attrs(html: str, testid: str, attr: str | None = None) -> list[str]:
    """The `attr` values (or the count, as "") of the elements with this data-testid."""
    found = []
    for tag in re.findall(rf"<[^>]*data-testid=\"{re.escape(testid)}\"[^>]*>", html):
        if attr is None:
            found.append("")
            continue
        m = re.search(rf'{re.escape(attr)}="([^"]*)"', tag)
        found.append(m.group(1) if m else "")
    return found


def form_token(html: str) -> str:
    """The CSRF token in a page's forms."""
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m is not None, "no form with a CSRF token on the page"
    return m.group(1)


def error_text(html: str) -> str:
    """The message of an error page (`data-testid="error"`)."""
    text = html.split('data-testid="error" role="alert">', 1)[1].split("</div>", 1)[0]
    return html_lib.unescape(text)


def allow_all(_request: Any) -> str:
    return "all"
