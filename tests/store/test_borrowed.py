"""`store.borrowed`: oncely's statements on a DB-API connection lent by its owner (Django's),
inside the owner's transaction. One suite over SQLite (stdlib sqlite3, with the converters
Django's connection has), psycopg 3 and psycopg2 (each with Django's json-as-text loaders)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from oncely import Oncely
from oncely.store import ClaimAnswer, ClaimRequest, borrowed


def _migrate(url: str) -> None:
    async def go() -> None:
        app = Oncely(url)
        await app.migrate()
        await app.aclose()

    asyncio.run(go())


class Owner:
    """A connection and the transaction its owner controls, as Django holds them."""

    def __init__(self, conn: Any, name: str, begin: str | None) -> None:
        self.conn, self.name, self._begin = conn, name, begin

    def begin(self) -> None:
        if self._begin:
            self.conn.execute(self._begin)

    def commit(self) -> None:
        if self.name == "sqlite":
            self.conn.execute("COMMIT")
        else:
            self.conn.commit()

    def rollback(self) -> None:
        if self.name != "sqlite":
            self.conn.rollback()
        elif self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def count(self, sql: str) -> int:
        cur = self.conn.cursor()
        cur.execute(sql)
        value = int(cur.fetchone()[0])
        cur.close()
        self.rollback()
        return value


def _sqlite(url: str) -> Owner:
    conn = sqlite3.connect(
        make_url(url).database or "",
        detect_types=sqlite3.PARSE_DECLTYPES | sqlite3.PARSE_COLNAMES,
        isolation_level=None,  # Django: autocommit, and BEGIN of its own in atomic()
    )
    sqlite3.register_converter("datetime", lambda b: datetime.fromisoformat(b.decode()))
    return Owner(conn, "sqlite", "BEGIN")


def _psycopg(url: str) -> Owner:
    import psycopg
    from psycopg.types.string import TextLoader

    conn = psycopg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    conn.adapters.register_loader("jsonb", TextLoader)  # as Django does
    conn.adapters.register_loader("json", TextLoader)
    return Owner(conn, "postgresql", None)


def _psycopg2(url: str) -> Owner:
    import psycopg2
    import psycopg2.extras

    conn = psycopg2.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    psycopg2.extras.register_default_jsonb(conn_or_curs=conn, loads=lambda x: x)  # as Django
    return Owner(conn, "postgresql", None)


@pytest.fixture(
    params=[
        "sqlite3",
        pytest.param("psycopg", marks=pytest.mark.postgres),
        pytest.param("psycopg2", marks=pytest.mark.postgres),
    ]
)
def owner(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Owner]:
    if request.param == "sqlite3":
        url = f"sqlite:///{tmp_path / 'lent.db'}"
        _migrate(url)
        made = _sqlite(url)
    else:
        from tests.conftest import _reset_postgres

        url = request.getfixturevalue("postgres_database")
        _reset_postgres(url)
        _migrate(url)
        made = _psycopg(url) if request.param == "psycopg" else _psycopg2(url)
    yield made
    made.rollback()
    made.conn.close()


def test_a_claim_commits_or_rolls_back_with_the_owners_transaction(owner: Owner) -> None:
    owner.begin()
    with borrowed.borrow(owner.conn, owner.name) as conn:
        assert borrowed.claim(conn, "invoices", "2026-05")
    owner.rollback()
    assert owner.count("SELECT count(*) FROM oncely_runs") == 0
    owner.begin()
    with borrowed.borrow(owner.conn, owner.name) as conn:
        assert borrowed.claim(conn, "invoices", "2026-05", "web-1")
        borrowed.finish(conn, "invoices", "2026-05")
    owner.commit()
    owner.begin()
    with borrowed.borrow(owner.conn, owner.name) as conn:
        assert not borrowed.claim(conn, "invoices", "2026-05")
        claim = borrowed.claim_in(conn, "invoices", "2026-05")
    owner.rollback()
    assert claim is not None and claim.claimed_by == "web-1"
    assert claim.claimed_at.tzinfo is not None and claim.finished_at is not None


def test_lock_and_claim_says_taken_for_a_slot_that_ran(owner: Owner) -> None:
    slot = datetime(2026, 6, 5, 23, 0, tzinfo=timezone.utc)
    request = ClaimRequest("close", "k1", slot, "r1")
    owner.begin()
    with borrowed.borrow(owner.conn, owner.name) as conn:
        assert borrowed.lock_and_claim(conn, request) is ClaimAnswer.CLAIMED
    owner.commit()
    owner.begin()
    with borrowed.borrow(owner.conn, owner.name) as conn:
        assert borrowed.lock_and_claim(conn, request) is ClaimAnswer.TAKEN
        claim = borrowed.claim_in(conn, "close", "k1")
    owner.rollback()
    assert claim is not None and claim.scheduled_for == slot


def test_enqueue_exists_iff_the_owner_commits_and_keys_return_the_task(owner: Owner) -> None:
    entry = {"task": "mail", "queue": "default", "args": {"to": "ana"}, "idempotency_key": "k"}
    owner.begin()
    with borrowed.borrow(owner.conn, owner.name) as conn:
        borrowed.enqueue(conn, [entry])
    owner.rollback()
    assert owner.count("SELECT count(*) FROM oncely_tasks") == 0
    owner.begin()
    with borrowed.borrow(owner.conn, owner.name) as conn:
        (first,) = borrowed.enqueue(conn, [entry])
    owner.commit()
    owner.begin()
    with borrowed.borrow(owner.conn, owner.name) as conn:
        (again,) = borrowed.enqueue(conn, [entry])
    owner.rollback()
    assert again.duplicate and again.id == first.id
    assert again.args == {"to": "ana"}  # decoded, whatever the owner's json loaders say
    assert owner.count("SELECT count(*) FROM oncely_tasks") == 1


def test_the_owners_connection_keeps_its_own_conversions(owner: Owner) -> None:
    """Lending changes nothing on the owner's connection (its json stays text for Django)."""
    owner.begin()
    with borrowed.borrow(owner.conn, owner.name) as conn:
        borrowed.enqueue(conn, [{"task": "t", "queue": "q", "args": {"a": 1}}])
    owner.commit()
    cur = owner.conn.cursor()
    cur.execute("SELECT args FROM oncely_tasks")
    (value,) = cur.fetchone()
    cur.close()
    owner.rollback()
    assert isinstance(value, str) and json.loads(value) == {"a": 1}


def test_a_claim_outside_the_schema_is_a_clear_error(owner: Owner) -> None:
    from oncely import SchemaMissingError

    cur = owner.conn.cursor()
    owner.begin()
    cur.execute("DROP TABLE oncely_runs")
    with borrowed.borrow(owner.conn, owner.name) as conn, pytest.raises(SchemaMissingError):
        borrowed.claim(conn, "invoices", "x")
    cur.close()
    owner.rollback()
