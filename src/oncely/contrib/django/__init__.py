"""oncely for Django: claims and jobs on Django's own transaction, a `django.tasks` backend,
`manage.py oncely`, oncely's tables by `manage.py migrate`, and their admin pages.

`INSTALLED_APPS += ["oncely.contrib.django"]`; settings `ONCELY = {"APP": "proj.jobs:app",
"DATABASE": "default"}` (both optional). See docs/how-to/django.md.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LeaseLostError",
    "Oncely",
    "TaskBackend",
    "claim",
    "enqueue",
    "once",
    "run_attempt",
]

_WHERE = {
    "Oncely": ".app",
    "claim": ".claims",
    "once": ".claims",
    "LeaseLostError": ".tasks",
    "TaskBackend": ".tasks",
    "enqueue": ".tasks",
    "run_attempt": ".tasks",
}


def __getattr__(name: str) -> Any:
    # Lazily, so that Django can import the app (INSTALLED_APPS) before its settings and
    # app registry are ready, and the tasks backend is imported only where it is used.
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
