"""Helpers of the Django project's tests (a module of its own: `conftest` is not importable
by name from every test directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    return subprocess.Popen(
        [sys.executable, str(HERE / "manage.py"), *args],
        cwd=HERE,
        env={**os.environ, **env, "SHOP_DATABASE": alias, **(extra or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
