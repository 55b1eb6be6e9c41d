"""Rows as oncely's values: what every area reads back, mapped in one place."""

from __future__ import annotations

import json
from typing import Any

from ..model import Attempt, AuditEntry, Claim, TaskRecord, TaskState


def claim_from_row(row: Any) -> Claim:
    """An oncely_runs row as a Claim."""
    return Claim(
        job=row.job,
        key=row.key,
        scheduled_for=row.scheduled_for,
        claimed_at=row.claimed_at,
        claimed_by=row.claimed_by,
        finished_at=row.finished_at,
    )


def record(row: Any, *, duplicate: bool = False) -> TaskRecord:
    """A task row as a TaskRecord."""
    return TaskRecord(
        id=row.id,
        task=row.task,
        queue=row.queue,
        args=row.args,
        state=TaskState(row.state),
        attempt=row.attempt,
        run_at=row.run_at,
        created_at=row.created_at,
        idempotency_key=row.idempotency_key,
        started_at=row.started_at,
        finished_at=row.finished_at,
        locked_by=row.locked_by,
        lease_expires_at=row.lease_expires_at,
        error=row.error,
        duplicate=duplicate,
        priority=row.priority,
        result=None if row.result is None else json.loads(row.result),
    )


def attempt_from_row(row: Any, alive: bool = False) -> Attempt:
    """An oncely_attempts row as an Attempt (`alive`: its process is known to run)."""
    return Attempt(
        id=row.id,
        job=row.job,
        key=row.key,
        slot=row.slot,
        outcome=row.outcome,
        replica=row.replica,
        started_at=row.started_at,
        finished_at=row.finished_at,
        recorded_at=row.recorded_at,
        error_class=row.error_class,
        error=row.error,
        slot_last=row.slot_last,
        cancel_requested_at=row.cancel_requested_at,
        cancel_requested_by=row.cancel_requested_by,
        alive=alive,
        final=bool(row.final),
        retry_at=row.retry_at,
    )


def audit_from_row(row: Any) -> AuditEntry:
    """An oncely_audit row as an AuditEntry."""
    return AuditEntry(
        id=row.id,
        at=row.at,
        actor=row.actor,
        action=row.action,
        job=row.job,
        target=row.target,
        reason=row.reason,
        result=row.result,
    )
