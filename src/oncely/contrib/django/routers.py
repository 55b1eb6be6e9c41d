"""`DATABASE_ROUTERS = ["oncely.contrib.django.routers.OncelyRouter"]`: the admin pages read
oncely's tables from the database `ONCELY["DATABASE"]` names (needed only when that is not
"default")."""

from __future__ import annotations

from typing import Any

from .connection import default_alias


class OncelyRouter:
    """Reads and writes of oncely's models go to `ONCELY["DATABASE"]`."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return default_alias() if model._meta.app_label == "oncely" else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return default_alias() if model._meta.app_label == "oncely" else None
