"""The admin's page of the jobs in code: each job's schedule in words, zone, next slot, latest
due slot and its outcome, and its pause; pause and resume as buttons.

Pause and resume call the same `Oncely` methods as `oncely pause JOB` / `oncely resume JOB`
(checked and audited there, with `django-admin:USERNAME` as the actor). The page needs the
code job's view permission, the buttons its change permission; they are POST forms behind
Django's CSRF check, as every admin form is (`admin_site.admin_view`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.decorators import method_decorator
from django.views.decorators.http import require_POST

from ...app import Oncely as CoreOncely
from ...errors import OncelyError
from .jobs import JobRow, job_rows
from .models import CodeJob
from .operated import actor, call

MAX_REASON = 500
"""Characters of a pause's reason the form accepts."""


@admin.register(CodeJob)
class CodeJobAdmin(admin.ModelAdmin):
    """The jobs page (its own template): no add, change form or delete, only the list."""

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name="oncely_codejob_changelist"),
            path("<path:job>/pause/", wrap(self.pause_view), name="oncely_codejob_pause"),
            path("<path:job>/resume/", wrap(self.resume_view), name="oncely_codejob_resume"),
        ]

    def changelist_view(self, request: Any, extra_context: Any = None) -> TemplateResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        rows: list[JobRow] = []
        try:
            rows = call(job_rows)
        except OncelyError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Code jobs",
            "rows": rows,
            "can_change": self.has_change_permission(request),
            "max_reason": MAX_REASON,
        }
        return TemplateResponse(request, "admin/oncely/code_jobs.html", context)

    @method_decorator(require_POST)
    def pause_view(self, request: Any, job: str) -> HttpResponseRedirect:
        reason = (request.POST.get("reason") or "").strip()[:MAX_REASON] or None
        who = actor(request)

        async def pause(app: CoreOncely) -> object:
            return await app.pause(job, reason=reason, actor=who)

        return self._act(request, pause, f"job {job} paused")

    @method_decorator(require_POST)
    def resume_view(self, request: Any, job: str) -> HttpResponseRedirect:
        who = actor(request)

        async def resume(app: CoreOncely) -> object:
            return await app.resume(job, actor=who)

        return self._act(request, resume, f"job {job} resumed")

    def _act(
        self, request: Any, work: Callable[[CoreOncely], Awaitable[object]], done: str
    ) -> HttpResponseRedirect:
        """`work` through oncely's audited method, its refusal (unknown job, paused already,
        not paused) reported on the page; back to the list either way."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        try:
            call(work)
        except OncelyError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.message_user(request, done, messages.SUCCESS)
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:oncely_codejob_changelist"))
