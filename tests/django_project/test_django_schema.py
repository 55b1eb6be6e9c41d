"""`manage.py migrate` creates oncely's tables exactly as `oncely migrate` does, on both DBs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from shop_helpers import create_pg_database, drop_pg_database, pg_url

from oncely import Oncely
from oncely.store.migrations import applied_from

_SQLITE = (
    "SELECT type, name, tbl_name, sql FROM sqlite_master "
    "WHERE name LIKE 'oncely%' ORDER BY type, name"
)
_PG = [
    "SELECT table_name, column_name, data_type, is_nullable, column_default, "
    "character_maximum_length FROM information_schema.columns "
    "WHERE table_name LIKE 'oncely%' ORDER BY table_name, ordinal_position",
    "SELECT tablename, indexname, indexdef FROM pg_indexes "
    "WHERE tablename LIKE 'oncely%' ORDER BY indexname",
    "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
    "WHERE conrelid::regclass::text LIKE 'oncely%' ORDER BY conname",
    "SELECT event_object_table, trigger_name, action_timing, event_manipulation, "
    "action_statement FROM information_schema.triggers "
    "WHERE event_object_table LIKE 'oncely%' ORDER BY trigger_name, event_manipulation",
    "SELECT proname, prosrc FROM pg_proc WHERE proname LIKE 'oncely%' ORDER BY proname",
    "SELECT obj_description(c.oid) FROM pg_class c WHERE relname LIKE 'oncely%' ORDER BY relname",
    "SELECT version FROM oncely_schema ORDER BY version",
]


def _schema(url: str, queries: list[str]) -> list[Any]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        out = [[tuple(r) for r in conn.execute(sa.text(q))] for q in queries]
    engine.dispose()
    return out


def _migrated_by_oncely(url: str) -> None:
    async def go() -> None:
        app = Oncely(url)
        await app.migrate()
        await app.aclose()

    asyncio.run(go())


def test_the_two_schemas_are_identical_on_sqlite(
    django_project: dict[str, str], tmp_path: Path
) -> None:
    by_django = _schema(f"sqlite:///{django_project['SHOP_SQLITE']}", [_SQLITE])
    cli_url = f"sqlite:///{tmp_path / 'cli.db'}"
    _migrated_by_oncely(cli_url)
    by_cli = _schema(cli_url, [_SQLITE])
    assert by_django == by_cli
    names = {row[1] for row in by_django[0]}
    assert {"oncely_runs", "oncely_tasks", "oncely_schema", "oncely_tasks_key"} <= names


def test_the_two_schemas_are_identical_on_postgres(django_project: dict[str, str]) -> None:
    django_url = pg_url(django_project["SHOP_PG_NAME"])
    by_django = _schema(django_url, _PG)
    name = f"oncely_django_cli_{os.getpid()}"
    create_pg_database(name)
    try:
        _migrated_by_oncely(pg_url(name))
        by_cli = _schema(pg_url(name), _PG)
    finally:
        drop_pg_database(name)
    assert by_django == by_cli
    assert by_django[3], "the NOTIFY trigger is there"
    assert [v for (v,) in by_django[-1]] == list(applied_from(1))


def test_a_database_migrated_by_oncely_migrate_is_left_as_it_is_by_django(
    django_project: dict[str, str], tmp_path: Path
) -> None:
    """`oncely migrate` first, then the Django migration's function: nothing applied twice."""
    from oncely.store import borrowed

    url = f"sqlite:///{tmp_path / 'first.db'}"
    _migrated_by_oncely(url)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        applied = borrowed.migrate(conn, lambda v: RuntimeError(v))
    engine.dispose()
    assert applied == []


def test_a_project_migrated_before_schema_11_gets_the_later_versions_from_migrate(
    django_project: dict[str, str],
) -> None:
    """A project whose `manage.py migrate` ran when oncely's schema was 10 (0002 applied, no
    oncely_task_errors) gets versions 11 and later from the next `manage.py migrate`."""
    from django.core.management import call_command
    from django.db import connections

    from oncely.store.migrations import LATEST

    call_command("migrate", "oncely", "0002", database="default", verbosity=0)
    with connections["default"].cursor() as cursor:  # the database as schema 10 left it
        cursor.execute("DROP TABLE oncely_task_errors")
        cursor.execute("DELETE FROM oncely_schema WHERE version > 10")
    call_command("migrate", database="default", verbosity=0)
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT max(version) FROM oncely_schema")
        assert cursor.fetchone()[0] == LATEST
        cursor.execute("SELECT count(*) FROM oncely_task_errors")  # the table is back
        assert cursor.fetchone()[0] == 0
