"""The app `manage.py oncely` acts on: `ONCELY["APP"]`, or an app with no jobs."""

from __future__ import annotations

from .app import Oncely
from .connection import oncely_settings

DEFAULT_APP = "oncely.contrib.django.settings_app:app"
"""What `manage.py oncely` loads when settings.ONCELY names no APP."""

app = Oncely()
"""An app with no jobs on the configured database (history, tasks, migrate …)."""


def app_spec() -> str:
    """`ONCELY["APP"]` (MODULE:ATTR), else DEFAULT_APP."""
    return str(oncely_settings().get("APP") or DEFAULT_APP)
