"""oncely's schema, as numbered steps; `migrate` applies the ones a database lacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

from . import postgres
from .tables import runs, tasks


def _v1_runs(conn: Connection) -> None:
    runs.create(conn, checkfirst=True)


def _v2_tasks(conn: Connection) -> None:
    tasks.create(conn, checkfirst=True)
    if conn.dialect.name == "postgresql":
        for statement in postgres.TASKS_NOTIFY_DDL:
            conn.exec_driver_sql(statement)


Step = Callable[[Connection], Any]

MIGRATIONS: list[tuple[int, str, Step]] = [
    (1, "the oncely_runs ledger", _v1_runs),
    (2, "the oncely_tasks queue (and its NOTIFY trigger on Postgres)", _v2_tasks),
]
"""(version, what it adds, step); append only, never edit a released step."""

LATEST = MIGRATIONS[-1][0]
