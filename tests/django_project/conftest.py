"""The Django test project (shop/), set up once per pytest process on SQLite and Postgres.

Django's settings are process-wide, so one settings module serves both databases: alias
"default" is a SQLite file, alias "pg" a Postgres database of this process
(`oncely_django_<pid>`); each test runs once per alias (the `alias` fixture). Both are
migrated with `manage.py migrate`'s machinery (`call_command("migrate")`), as a user would.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from shop_helpers import create_pg_database, drop_pg_database, empty

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def django_project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Django set up on the shop project; the environment its manage.py processes need."""
    import django
    from django.core.management import call_command

    pg_name = f"oncely_django_{os.getpid()}"
    create_pg_database(pg_name)
    env = {
        "SHOP_SQLITE": str(tmp_path_factory.mktemp("shop") / "shop.db"),
        "SHOP_PG_NAME": pg_name,
        "DJANGO_SETTINGS_MODULE": "shop.settings",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        django.setup()  # reads the settings module (and its SHOP_* variables) once
    finally:
        # Not left in this process's environment: other tests' processes must not inherit
        # them (the manage.py processes of these tests get them from `manage`).
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    call_command("migrate", verbosity=0)
    call_command("migrate", database="pg", verbosity=0)
    yield env
    from django.db import connections

    connections.close_all()
    drop_pg_database(pg_name)


@pytest.fixture(params=["default", pytest.param("pg", marks=pytest.mark.postgres)])
def alias(request: pytest.FixtureRequest, django_project: dict[str, str]) -> Iterator[str]:
    """A Django database alias ("default": SQLite, "pg": Postgres), emptied for the test."""
    from django.db import connections

    empty(request.param)
    yield request.param
    connections.close_all()
