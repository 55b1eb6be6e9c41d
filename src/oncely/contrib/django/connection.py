"""Django's connection, lent to oncely's statements inside the caller's `atomic()` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from sqlalchemy.engine import URL, Connection

from ...errors import BadInputError, ConfigError
from ...store import borrowed

DEFAULT_ALIAS = "default"


def oncely_settings() -> dict[str, Any]:
    """`settings.ONCELY` (a dict; empty if unset)."""
    value = getattr(settings, "ONCELY", {})
    if not isinstance(value, dict):
        raise ConfigError(f"settings.ONCELY must be a dict, got {type(value).__name__}")
    return value


def default_alias() -> str:
    """The database alias oncely uses when none is given: `ONCELY["DATABASE"]`, else default."""
    alias = oncely_settings().get("DATABASE", DEFAULT_ALIAS)
    if alias not in settings.DATABASES:
        raise ConfigError(
            f"settings.ONCELY['DATABASE'] is {alias!r}, which is not in settings.DATABASES"
        )
    return str(alias)


def _atomic_connection(using: str, what: str) -> Any:
    if using not in settings.DATABASES:
        raise BadInputError(f"{what}: no database {using!r} in settings.DATABASES")
    conn = connections[using]
    if not conn.in_atomic_block:
        raise BadInputError(
            f"{what} needs the caller's transaction: call it inside "
            f"`with transaction.atomic(using={using!r}):` so that it commits with your work "
            "or not at all"
        )
    conn.ensure_connection()
    return conn


@contextlib.contextmanager
def lent(using: str, what: str) -> Iterator[Connection]:
    """A SQLAlchemy Connection on Django's connection `using`, in its open atomic block;
    an error in it marks the block for rollback (as one of Django's own queries would)."""
    conn = _atomic_connection(using, what)
    with (
        transaction.mark_for_rollback_on_error(using),
        borrowed.borrow(conn.connection, conn.vendor) as sa_conn,
    ):
        yield sa_conn


def database_url(using: str) -> str:
    """A URL for oncely's own engine on the same database as Django's alias `using` (the
    worker's loops, `oncely history`, the admin's actions): Postgres or SQLite."""
    if using not in settings.DATABASES:
        raise ConfigError(f"no database {using!r} in settings.DATABASES")
    db = connections[using].settings_dict
    vendor = connections[using].vendor
    if vendor == "sqlite":
        name = str(db["NAME"])
        if name == ":memory:" or name.startswith("file:"):
            raise ConfigError(
                f"database {using!r} is an in-memory SQLite database, which another connection "
                "cannot see: give it (and its TEST) a file NAME"
            )
        return f"sqlite:///{name}"
    if vendor == "postgresql":
        url = URL.create(
            "postgresql",
            username=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            host=db.get("HOST") or None,
            port=int(db["PORT"]) if db.get("PORT") else None,
            database=db.get("NAME") or None,
        )
        return url.render_as_string(hide_password=False)
    raise ConfigError(f"oncely supports Postgres and SQLite, not Django's {vendor!r} backend")
