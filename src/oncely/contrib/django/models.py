"""oncely's tables as unmanaged models: read by the admin pages, written only by oncely.

The tables are created by this app's migration (which runs `oncely migrate`'s own steps);
Django never alters them (`managed = False`). Changes go through oncely's API (the admin's
actions call the same functions as `oncely tasks retry` / `discard`).
"""

from __future__ import annotations

import json
from typing import Any

from django.db import DatabaseError, models, transaction

from ...model import ScheduleRecord, TaskRecord, TaskState
from ...schedules import ledger_name
from ...tasks import decode_result


class SlotClaim(models.Model):
    """One claimed slot (or effect key): who ran it, when, and when it finished."""

    # The table's primary key is (job, key); the admin needs one column: the list pages
    # never open a single row by it.
    job = models.CharField(max_length=200, primary_key=True)
    key = models.CharField(max_length=200)
    scheduled_for = models.DateTimeField(null=True)
    claimed_at = models.DateTimeField()
    claimed_by = models.CharField(max_length=255)
    finished_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = "oncely_runs"
        ordering = ("-claimed_at",)
        verbose_name = "slot claim"

    def __str__(self) -> str:
        return f"{self.job} {self.key}"


class TaskErrorRow(models.Model):
    """One failed attempt of a task (schema 11): its error and traceback, worker and time."""

    id = models.BigAutoField(primary_key=True)
    task_id = models.BigIntegerField()
    attempt = models.IntegerField()
    error = models.TextField(null=True)
    by = models.CharField(max_length=255, null=True)
    at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "oncely_task_errors"
        ordering = ("id",)
        verbose_name = "task error"

    def __str__(self) -> str:
        return f"task #{self.task_id} attempt {self.attempt}"


def first_line(error: str | None) -> str:
    """An error's first line (`Type: message`), as a list shows it; the whole text (its
    traceback) is on the task's page."""
    return error.strip().splitlines()[0] if error and error.strip() else ""


class TaskRow(models.Model):
    """One row of oncely's task queue."""

    id = models.BigAutoField(primary_key=True)
    task = models.CharField(max_length=200)
    queue = models.CharField(max_length=100)
    args = models.JSONField()
    state = models.CharField(max_length=16)
    attempt = models.IntegerField()
    run_at = models.DateTimeField()
    created_at = models.DateTimeField()
    idempotency_key = models.CharField(max_length=255, null=True)
    lease_token = models.CharField(max_length=64, null=True)
    locked_by = models.CharField(max_length=255, null=True)
    started_at = models.DateTimeField(null=True)
    lease_expires_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    error = models.TextField(null=True)
    priority = models.IntegerField(default=0)
    result = models.TextField(null=True)  # JSON text: see `record`

    class Meta:
        managed = False
        db_table = "oncely_tasks"
        ordering = ("-id",)
        verbose_name = "task"

    def __str__(self) -> str:
        return f"{self.task} #{self.id}"

    def history(self) -> list[TaskErrorRow]:
        """Every failed attempt of this task that oncely kept, oldest first (none on a
        database older than schema 11, or for a task that never failed)."""
        alias = self._state.db or "default"
        rows = TaskErrorRow.objects.using(alias).filter(task_id=self.id).order_by("id")
        try:
            with transaction.atomic(using=alias):  # a savepoint: a missing table spoils nothing
                return list(rows)
        except DatabaseError:
            return []

    def record(self) -> TaskRecord:
        """The row as oncely's TaskRecord."""
        fields: dict[str, Any] = {
            name: getattr(self, name)
            for name in (
                "id",
                "task",
                "queue",
                "args",
                "attempt",
                "run_at",
                "created_at",
                "idempotency_key",
                "started_at",
                "finished_at",
                "locked_by",
                "lease_expires_at",
                "error",
                "priority",
            )
        }
        result = decode_result(self.result)
        return TaskRecord(state=TaskState(self.state), result=result, **fields)


class CodeJob(SlotClaim):
    """The admin's page of the jobs in code (`ONCELY["APP"]`): no table of its own (a proxy),
    only a place in the admin and its permissions (view: the page; change: pause, resume)."""

    class Meta:
        proxy = True
        verbose_name = "code job"


class ScheduleRow(models.Model):
    """One schedule kept as data (oncely_schedules), for the admin's list: read here, changed
    only through `app.schedules` (checked and audited there)."""

    name = models.CharField(max_length=200, primary_key=True)
    cron = models.CharField(max_length=200, null=True)
    every_seconds = models.FloatField(null=True)
    tz = models.CharField(max_length=64)
    target_kind = models.CharField(max_length=8)
    target = models.CharField(max_length=200)
    args = models.TextField()
    catch_up = models.CharField(max_length=8)
    grace_seconds = models.FloatField(null=True)
    overlap = models.CharField(max_length=8)
    timeout_seconds = models.FloatField(null=True)
    state = models.CharField(max_length=8)
    pause_reason = models.TextField(null=True)
    next_slot = models.DateTimeField(null=True)
    version = models.IntegerField()
    created_at = models.DateTimeField()
    changed_at = models.DateTimeField()
    changed_by = models.CharField(max_length=255)

    class Meta:
        managed = False
        db_table = "oncely_schedules"
        ordering = ("name",)
        verbose_name = "schedule"

    def __str__(self) -> str:
        return str(self.name)

    def record(self) -> ScheduleRecord:
        """The row as oncely's ScheduleRecord (what `app.schedules.get` returns)."""
        try:
            args = json.loads(self.args or "{}")
        except ValueError:
            args = {}
        return ScheduleRecord(
            name=self.name,
            cron=self.cron,
            every=self.every_seconds,
            tz=self.tz,
            target_kind=self.target_kind,
            target=self.target,
            args=args if isinstance(args, dict) else {},
            catch_up=self.catch_up,
            grace=self.grace_seconds,
            overlap=self.overlap,
            timeout=self.timeout_seconds,
            state=self.state,
            pause_reason=self.pause_reason,
            version=self.version,
            created_at=self.created_at,
            changed_at=self.changed_at,
            changed_by=self.changed_by,
            next_slot=self.next_slot,
            ledger_name=ledger_name(self.name),
        )
