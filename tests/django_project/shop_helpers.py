"""Helpers of the Django project's tests (a module of its own: `conftest` is not importable
by name from every test directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from tests.conftest import PG_ADMIN_URL
from tests.support import IN_CI

HERE = Path(__file__).resolve().parent


def count(alias: str, table: str, where: str = "", params: Any = ()) -> int:
    """Rows of `table` (committed or in this thread's open transaction) on `alias`."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table} {where}", params)
        return int(cursor.fetchone()[0])


def manage(
    env: dict[str, str], alias: str, *args: str, extra: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start `python manage.py ARGS` of the shop project in a real process, on `alias`."""
    # It runs in this directory: a relative $PYTHONPATH (`PYTHONPATH=src`) is made absolute,
    # so that it imports the oncely this process imports, not another one installed.
    path = os.environ.get("PYTHONPATH", "")
    absolute = os.pathsep.join(os.path.abspath(p) if p else p for p in path.split(os.pathsep))
    return subprocess.Popen(
        [sys.executable, str(HERE / "manage.py"), *args],
        cwd=HERE,
        env={
            **os.environ,
            **({"PYTHONPATH": absolute} if path else {}),
            **env,
            "SHOP_DATABASE": alias,
            **(extra or {}),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _admin() -> sa.Engine:
    url = make_url(PG_ADMIN_URL).set(drivername="postgresql+psycopg2")
    return sa.create_engine(url, isolation_level="AUTOCOMMIT")


def create_pg_database(name: str) -> None:
    admin = _admin()
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.OperationalError as exc:
        message = f"Postgres is not reachable at {make_url(PG_ADMIN_URL)!r}: {exc.orig}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    finally:
        admin.dispose()


def drop_pg_database(name: str) -> None:
    admin = _admin()
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def pg_url(name: str) -> str:
    return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def empty(alias: str) -> None:
    """Delete every row of oncely's and the shop's tables on `alias`."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        for table in (
            "oncely_runs",
            "oncely_tasks",
            "oncely_duplicates",
            "oncely_task_errors",
            "oncely_attempts",
            "oncely_pauses",
            "oncely_audit",
            "oncely_schedules",
            "shop_bonus",
            "shop_receipt",
        ):
            cursor.execute(f"DELETE FROM {table}")


def backdate_schedule(alias: str, name: str) -> None:
    """The schedule as if added a year ago: its slots since have come due (for `run_due`,
    which runs none from before the schedule was added). A test's setup, not oncely's API."""
    from datetime import timedelta

    from oncely.contrib.django.models import ScheduleRow

    rows = ScheduleRow.objects.using(alias).filter(name=name)
    (row,) = rows
    rows.update(created_at=row.created_at - timedelta(days=365))
