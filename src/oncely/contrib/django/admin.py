"""Read-only admin pages for slot claims and tasks; retry and discard as actions.

The actions call the same `Oncely` methods as `oncely tasks retry ID` / `oncely tasks discard
ID` (on the database of `ONCELY["DATABASE"]`), one task at a time, each audited with the staff
user as its actor (`django-admin:USERNAME`); a task in a state that cannot be retried or
discarded is reported and left as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib import admin, messages
from django.utils.html import format_html_join

from ...app import Oncely as CoreOncely
from ...cli.loading import load_app
from ...errors import OncelyError
from ...model import TaskRecord
from . import admin_jobs, admin_schedules  # noqa: F401  (register their pages)
from .app import Oncely
from .models import SlotClaim, TaskRow, first_line
from .settings_app import app_spec


class ReadOnly(admin.ModelAdmin):
    """Nothing is added, changed or deleted here: oncely writes these tables."""

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


def job_zone(job: str) -> ZoneInfo | timezone:
    """The zone of `job`'s schedule in `ONCELY["APP"]` (UTC for a job it does not have, an
    effect's key, or an app that cannot be loaded: the page still shows every claim)."""
    try:
        return load_app(app_spec()).registry.job(job).schedule.zone
    except (OncelyError, ImportError):
        return timezone.utc


@admin.register(SlotClaim)
class SlotClaimAdmin(ReadOnly):
    list_display = ("job", "key", "slot", "claimed_at", "claimed_by", "finished_at")
    list_display_links = None
    list_filter = ("job",)
    search_fields = ("job", "key", "claimed_by")

    @admin.display(description="slot (the job's zone)", ordering="scheduled_for")
    def slot(self, obj: SlotClaim) -> str:
        """The slot's time in its job's zone, as the job was handed it (`now`)."""
        when: datetime | None = obj.scheduled_for
        if when is None:
            return "-"
        if when.tzinfo is None:  # USE_TZ = False: taken as UTC, the time oncely writes
            when = when.replace(tzinfo=timezone.utc)
        zone = job_zone(obj.job)
        return f"{when.astimezone(zone).isoformat()} {zone}"


def _each(
    modeladmin: admin.ModelAdmin,
    request: Any,
    ids: list[int],
    change: Callable[[CoreOncely, int, str], Awaitable[TaskRecord]],
    done: str,
) -> None:
    actor = f"django-admin:{request.user.get_username()}"

    async def go() -> list[tuple[int, str | None]]:
        app = Oncely()  # the configured database; retry and discard need no registry
        out: list[tuple[int, str | None]] = []
        try:
            for task_id in ids:
                try:
                    await change(app, task_id, actor)
                    out.append((task_id, None))
                except OncelyError as exc:
                    out.append((task_id, str(exc)))
        finally:
            await app.aclose()
        return out

    for task_id, error in asyncio.run(go()):
        if error is None:
            modeladmin.message_user(request, f"task {task_id} {done}", messages.SUCCESS)
        else:
            modeladmin.message_user(request, error, messages.ERROR)


async def _retry(app: CoreOncely, task_id: int, actor: str) -> TaskRecord:
    return await app.retry_task(task_id, actor=actor)


async def _discard(app: CoreOncely, task_id: int, actor: str) -> TaskRecord:
    return await app.discard_task(task_id, actor=actor)


@admin.action(description="Retry the selected tasks now (oncely tasks retry)")
def retry(modeladmin: admin.ModelAdmin, request: Any, queryset: Any) -> None:
    ids = list(queryset.values_list("id", flat=True))
    _each(modeladmin, request, ids, _retry, "is available again")


@admin.action(description="Discard the selected tasks (oncely tasks discard)")
def discard(modeladmin: admin.ModelAdmin, request: Any, queryset: Any) -> None:
    ids = list(queryset.values_list("id", flat=True))
    _each(modeladmin, request, ids, _discard, "discarded")


@admin.register(TaskRow)
class TaskRowAdmin(ReadOnly):
    list_display = (
        "id",
        "task",
        "queue",
        "state",
        "priority",
        "attempt",
        "run_at",
        "finished_at",
        "last_error",
    )
    list_filter = ("state", "queue", "task")
    search_fields = ("task", "idempotency_key")
    readonly_fields = (*(f.name for f in TaskRow._meta.fields), "attempt_history")
    actions = (retry, discard)

    @admin.display(description="error")
    def last_error(self, obj: TaskRow) -> str:
        """The last error's first line (`Type: message`); its traceback is on the task's page."""
        return first_line(obj.error)

    @admin.display(description="every attempt's error")
    def attempt_history(self, obj: TaskRow) -> str:
        """Each failed attempt that oncely kept, oldest first: number, worker, time and the
        whole error with its traceback."""
        rows = obj.history()
        if not rows:
            return "-"
        html: str = format_html_join(
            "",
            "<p><b>attempt {}</b> on {} at {}</p><pre>{}</pre>",
            ((r.attempt, r.by or "?", r.at.isoformat(), r.error or "") for r in rows),
        )
        return html
