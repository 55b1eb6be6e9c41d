"""The app the admin's pages read and act through: a fresh `Oncely` per request on the
database of `ONCELY["DATABASE"]`, with the jobs (and tasks) of `ONCELY["APP"]`.

Fresh, because oncely's engine belongs to the event loop that opened it and each admin
request runs its calls in a loop of its own (`call`); the user's app object is only read
for its registries, never connected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ...app import Oncely as CoreOncely
from ...cli.loading import load_app
from ...schedules import Schedules
from .app import Oncely
from .settings_app import app_spec

T = TypeVar("T")


def operated_app() -> Oncely:
    """An app on the configured database with the registries of `ONCELY["APP"]` (its jobs'
    schedules are what the jobs page shows and what pause and resume check names against),
    the Django tasks of the oncely backend registered in them as a worker does (a schedule
    kept as data may run one). BadInputError if that app cannot be loaded."""
    loaded = load_app(app_spec())
    app = Oncely(using=getattr(loaded, "using", None))
    app.registry = loaded.registry
    app.tasks = loaded.tasks
    app.register_django_tasks()  # a schedule may run one (as the worker registers them)
    app.schedules = Schedules(lambda: app.store, app.registry, app.tasks)
    return app


def call(work: Callable[[CoreOncely], Awaitable[T]]) -> T:
    """`work(app)` on a fresh `operated_app()`, in an event loop of its own, the app's
    connections closed after it: for a (synchronous) admin view."""

    async def go() -> T:
        app = operated_app()
        try:
            return await work(app)
        finally:
            await app.aclose()

    return asyncio.run(go())


def actor(request: object) -> str:
    """The audit trail's actor of an admin request: `django-admin:USERNAME`."""
    user = getattr(request, "user", None)
    name = user.get_username() if user is not None else "?"
    return f"django-admin:{name}"
