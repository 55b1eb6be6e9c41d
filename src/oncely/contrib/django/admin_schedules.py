"""The admin's pages of the schedules kept as data: the list (the schedule in words, zone,
next slot, last run, enabled), add, edit, delete, and the actions enable, disable and "run
the due slot now".

The list reads oncely_schedules through an unmanaged model; every write goes through
`app.schedules` (`add_sync`, `update_sync`, `pause_sync`, `resume_sync`, `remove_sync`,
`run_due_sync`), which checks it and audits it with `django-admin:USERNAME` as the actor: a
change it refuses (a bad cron, an unknown zone or target, arguments that do not bind, a
stale edit) is the form's error and writes nothing. "Run the due slot now" runs the latest
due slot through its claim: once (a second run of the same slot reports that it ran).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from ...errors import OncelyError
from ...model import RunResult, ScheduleRecord, duration_text
from ...registry import CATCH_UP_CHOICES, OVERLAP_CHOICES
from ...schedules import MAX_NAME, Schedules, describe
from .jobs import ScheduleRuns, schedule_runs
from .models import ScheduleRow
from .operated import actor, call, operated_app


def _schedules() -> Schedules:
    return operated_app().schedules


def _zoned(when: datetime | None, tz: str) -> str:
    if when is None:
        return "-"
    try:
        return when.astimezone(ZoneInfo(tz)).isoformat()
    except (ValueError, KeyError):
        return when.isoformat()


def _duration(seconds: float | None) -> str:
    return "" if seconds is None else duration_text(seconds)


class ScheduleForm(forms.ModelForm):
    """A schedule's fields as `app.schedules.add` takes them; valid only once oncely took
    them (`clean` makes the call: its check is the write's, in one step)."""

    name = forms.CharField(max_length=MAX_NAME)
    cron = forms.CharField(
        required=False, max_length=200, help_text="5 fields, e.g. 0 9 * * MON, in the zone below"
    )
    every = forms.CharField(
        required=False, max_length=32, help_text="or an interval instead: 30s, 15m, 1h"
    )
    tz = forms.CharField(initial="UTC", max_length=64, help_text="an IANA zone")
    target = forms.ChoiceField(help_text="what each slot runs: a registered task or job")
    args = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        required=False,
        initial="{}",
        help_text="a JSON object: the keyword arguments it is called with",
    )
    catch_up = forms.ChoiceField(choices=[(c, c) for c in CATCH_UP_CHOICES], initial="latest")
    grace = forms.CharField(required=False, max_length=32, help_text="e.g. 5m; empty: none")
    overlap = forms.ChoiceField(choices=[(c, c) for c in OVERLAP_CHOICES], initial="skip")
    timeout = forms.CharField(required=False, max_length=32, help_text="e.g. 10m; empty: none")
    enabled = forms.BooleanField(required=False, initial=True)
    version = forms.IntegerField(required=False, widget=forms.HiddenInput)

    by = "django-admin"
    """The actor of the change (set per request by the admin)."""

    class Meta:
        model = ScheduleRow
        fields: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schedules = _schedules()
        targets = [(f"task:{t.name}", f"task {t.name}") for t in self.schedules.tasks]
        targets += [(f"job:{j.name}", f"job {j.name}") for j in self.schedules.jobs]
        self.fields["target"].choices = [("", "---------"), *sorted(targets)]
        row = self.instance
        if row.pk and not self.is_bound:
            self.initial.update(_initial(row.record()))
        if row.pk:
            self.fields["name"].disabled = True

    def clean_args(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("args") or "").strip() or "{}"
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValidationError(f"not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValidationError('a JSON object of keyword arguments, e.g. {"customer": 7}')
        return value

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean()
        if self.errors:
            return data
        kind, _, target = str(data["target"]).partition(":")
        fields = {
            "cron": data.get("cron") or None,
            "every": data.get("every") or None,
            "tz": data.get("tz") or "UTC",
            "task": target if kind == "task" else None,
            "job": target if kind == "job" else None,
            "args": data.get("args") or {},
            "catch_up": data["catch_up"],
            "grace": data.get("grace") or None,
            "overlap": data["overlap"],
            "timeout": data.get("timeout") or None,
            "paused": not data.get("enabled"),
            "by": self.by,
        }
        try:
            if self.instance.pk:
                self.record = self.schedules.update_sync(
                    self.instance.pk, version=data.get("version"), **fields
                )
            else:
                self.record = self.schedules.add_sync(data["name"], **fields)
        except OncelyError as exc:
            raise ValidationError(str(exc)) from None
        return data

    def validate_unique(self) -> None:
        """oncely checks the name (`add` refuses a duplicate): nothing to check here."""


def _initial(rec: ScheduleRecord) -> dict[str, Any]:
    return {
        "name": rec.name,
        "cron": rec.cron or "",
        "every": _duration(rec.every),
        "tz": rec.tz,
        "target": f"{rec.target_kind}:{rec.target}",
        "args": json.dumps(rec.args, sort_keys=True),
        "catch_up": rec.catch_up,
        "grace": _duration(rec.grace),
        "overlap": rec.overlap,
        "timeout": _duration(rec.timeout),
        "enabled": rec.state == "active",
        "version": rec.version,
    }


def _each(
    model_admin: admin.ModelAdmin,
    request: Any,
    queryset: Any,
    change: Callable[[Schedules, str, str], str],
) -> None:
    """`change(schedules, name, actor)` for each selected schedule, its message (or oncely's
    refusal) reported one by one."""
    schedules = _schedules()
    who = actor(request)
    for name in queryset.values_list("name", flat=True):
        try:
            done = change(schedules, name, who)
        except OncelyError as exc:
            model_admin.message_user(request, f"schedule {name}: {exc}", messages.ERROR)
        else:
            model_admin.message_user(request, f"schedule {name}: {done}", messages.SUCCESS)


@admin.action(description="Enable the selected schedules", permissions=["change"])
def enable(model_admin: admin.ModelAdmin, request: Any, queryset: Any) -> None:
    def resume(schedules: Schedules, name: str, who: str) -> str:
        rec = schedules.resume_sync(name, by=who)
        return f"enabled, next slot {_zoned(rec.next_slot, rec.tz)}"

    _each(model_admin, request, queryset, resume)


@admin.action(description="Disable the selected schedules", permissions=["change"])
def disable(model_admin: admin.ModelAdmin, request: Any, queryset: Any) -> None:
    def pause(schedules: Schedules, name: str, who: str) -> str:
        schedules.pause_sync(name, by=who)
        return "disabled"

    _each(model_admin, request, queryset, pause)


def ran(result: RunResult, tz: str) -> str:
    """A `run_due` result in words: ran, already ran (by whom, when), or what stopped it."""
    slot = _zoned(result.slot, tz)
    status = result.status.value
    if status == "ran":
        return f"slot {slot} ran"
    if status == "skipped":
        claim = result.claim
        by = f" by {claim.claimed_by} at {claim.claimed_at.isoformat()}" if claim else ""
        return f"slot {slot} already ran{by}: it did not run again"
    error = f": {type(result.error).__name__}: {result.error}" if result.error else ""
    return f"slot {slot} did not run ({status}{error})"


@admin.action(description="Run the due slot now (once)", permissions=["change"])
def run_due(model_admin: admin.ModelAdmin, request: Any, queryset: Any) -> None:
    def run(schedules: Schedules, name: str, who: str) -> str:
        result = schedules.run_due_sync(name, by=who)
        return ran(result, schedules.get_sync(name).tz)

    _each(model_admin, request, queryset, run)


@admin.register(ScheduleRow)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    actions = (enable, disable, run_due)
    list_display_links = ("name",)
    list_filter = ("state", "target_kind")
    search_fields = ("name", "target")
    fieldsets = (
        (None, {"fields": ("name", "enabled")}),
        ("When", {"fields": ("cron", "every", "tz")}),
        ("What", {"fields": ("target", "args")}),
        ("How", {"fields": ("catch_up", "grace", "overlap", "timeout", "version")}),
    )

    def get_form(self, request: Any, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"by": actor(request)})

    def get_list_display(self, request: Any) -> Any:
        # Django asks more than once per request: one dict per request, which
        # get_changelist_instance fills for the page's rows.
        if not hasattr(request, "oncely_runs"):
            request.oncely_runs = {}
        runs: dict[str, ScheduleRuns] = request.oncely_runs

        @admin.display(description="last run")
        def last_run(row: ScheduleRow) -> str:
            found = runs.get(row.name)
            claim = found.last if found else None
            if claim is None:
                return "-"
            done = "ran" if claim.finished_at is not None else "running"
            return f"{_zoned(claim.scheduled_for, row.tz)} {done} on {claim.claimed_by}"

        @admin.display(description="latest due slot")
        def latest_slot(row: ScheduleRow) -> str:
            found = runs.get(row.name)
            return (found.latest if found else None) or "-"

        return ("name", "words", "zone", "target_", "next", last_run, latest_slot, "enabled")

    def get_changelist_instance(self, request: Any) -> Any:
        """The list's page, with its schedules' runs (a few reads for the page, whatever the
        size of the ledger or the number of schedules)."""
        changelist = super().get_changelist_instance(request)
        records = [row.record() for row in changelist.result_list]
        runs = getattr(request, "oncely_runs", None)
        if records and runs is not None:
            try:
                runs.update(call(lambda app: schedule_runs(app, records)))
            except OncelyError as exc:
                self.message_user(request, str(exc), messages.ERROR)
        return changelist

    @admin.display(description="schedule")
    def words(self, row: ScheduleRow) -> str:
        try:
            return describe(row.record())
        except OncelyError:
            return row.cron or _duration(row.every_seconds)

    @admin.display(description="zone", ordering="tz")
    def zone(self, row: ScheduleRow) -> str:
        return str(row.tz)

    @admin.display(description="runs", ordering="target")
    def target_(self, row: ScheduleRow) -> str:
        return f"{row.target_kind} {row.target}"

    @admin.display(description="next slot (its zone)", ordering="next_slot")
    def next(self, row: ScheduleRow) -> str:
        return _zoned(row.next_slot, row.tz) if row.state == "active" else "-"

    @admin.display(description="enabled", boolean=True, ordering="state")
    def enabled(self, row: ScheduleRow) -> bool:
        return bool(row.state == "active")

    # Django wraps these two views in an atomic block on the model's database; here the writes
    # are oncely's, each in a transaction of its own, so the block would only hold a read
    # snapshot open across them (on SQLite, the admin's log entry could then not be written).
    def changeform_view(
        self, request: Any, object_id: Any = None, form_url: str = "", extra_context: Any = None
    ) -> Any:
        return self._changeform_view(request, object_id, form_url, extra_context)

    def delete_view(self, request: Any, object_id: Any, extra_context: Any = None) -> Any:
        return self._delete_view(request, object_id, extra_context)

    def save_model(self, request: Any, obj: Any, form: Any, change: bool) -> None:
        """Nothing: the form's `clean` wrote the change through `app.schedules`."""

    def delete_model(self, request: Any, obj: ScheduleRow) -> None:
        _schedules().remove_sync(obj.name, by=actor(request))

    def delete_queryset(self, request: Any, queryset: Any) -> None:
        schedules, who = _schedules(), actor(request)
        for name in queryset.values_list("name", flat=True):
            schedules.remove_sync(name, by=who)
