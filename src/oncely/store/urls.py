"""Database URLs: the async driver oncely uses for each database, and its sync twin."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ..errors import BadInputError
from ..masking import mask_url
from .dialects import dialect_for

_DRIVERS = {
    "postgres": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
}


def normalize_url(url: str) -> str:
    """A database URL with oncely's async driver for its database (postgres → asyncpg)."""
    try:
        parsed = make_url(url)
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise BadInputError(f"not a database URL: {mask_url(url)!r}") from exc
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        raise BadInputError(
            f"unsupported database {parsed.drivername!r} in {mask_url(url)!r}: "
            "use postgresql://… or sqlite:///…"
        )
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def sync_url(url: str) -> str:
    """The same database with a synchronous driver: psycopg2, psycopg 3 (`sync`), or pysqlite."""
    parsed = make_url(normalize_url(url))
    driver = dialect_for(parsed.get_backend_name()).sync_driver()
    return parsed.set(drivername=driver).render_as_string(hide_password=False)
