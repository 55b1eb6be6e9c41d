"""A data schedule as the pages read it: its Job (to explain its slots as a code job's),
its row on the list and the overview (the latest due slot's outcome, the last run)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..model import Claim, ScheduleRecord
from ..registry import Job
from ..schedules import describe, schedule_of
from .render import Settings, gather
from .timeline import last_outcomes

OVERVIEW_ROWS = 10
"""Schedules the overview shows (the first by name), with a link to the list."""


def _nothing(db: Any, now: datetime) -> None:  # pragma: no cover - never called
    """The function of the Job a page builds to read a schedule's slots: pages run nothing."""


def job_of(record: ScheduleRecord) -> Job:
    """The record as a Job under its ledger name: what the timeline and `explain_slot`
    read (its slots, their keys, its catch-up), never run (`oncely.schedules.job_for`,
    which the worker runs, needs the target registered; a page shows a schedule whose
    target this app lacks too)."""
    return Job(
        name=record.ledger_name,
        schedule=schedule_of(record),
        func=_nothing,
        catch_up=record.catch_up,  # type: ignore[arg-type]
        grace=None if record.grace is None else timedelta(seconds=record.grace),
        overlap=record.overlap,  # type: ignore[arg-type]
        timeout=None if record.timeout is None else timedelta(seconds=record.timeout),
    )


def target_of(record: ScheduleRecord) -> str:
    return f"{record.target_kind}:{record.target}"


@dataclass(frozen=True)
class ScheduleRow:
    """One schedule on the list (and the overview)."""

    record: ScheduleRecord
    words: str
    last_run: Claim | None
    last_slot: datetime | None
    last_outcome: str | None
    last_sentence: str | None
    last_label: str | None = None


async def rows(
    settings: Settings, records: list[ScheduleRecord], now: datetime
) -> list[ScheduleRow]:
    """The rows of `records`: each with its latest due slot's outcome (three reads for all,
    as the overview's jobs) and its newest claim: the latest slot's when it ran, else one
    read on the ledger's `(job, claimed_at)` index for that schedule alone (never the
    claims of every schedule)."""
    if not records:
        return []
    app = settings.app
    jobs = [job_of(r) for r in records]
    created = {r.ledger_name: r.created_at for r in records}
    last = await last_outcomes(app, jobs, now, await app.pauses(), created)
    unknown = [
        r.ledger_name
        for r, latest in zip(records, last, strict=True)
        if latest.claim is None and latest.outcome not in (None, "before_job")
    ]
    found = await gather(*(app.store.claims.history(name, 1) for name in unknown))
    newest = {name: claims[0] for name, claims in zip(unknown, found, strict=True) if claims}
    return [
        ScheduleRow(
            record=r,
            words=describe(r),
            last_run=latest.claim or newest.get(r.ledger_name),
            last_slot=latest.at,
            last_outcome=latest.outcome,
            last_sentence=latest.sentence,
            last_label=latest.label,
        )
        for r, latest in zip(records, last, strict=True)
    ]


async def overview_rows(settings: Settings, now: datetime) -> tuple[list[ScheduleRow], bool]:
    """The overview's schedules: the first OVERVIEW_ROWS by name, and whether there are more."""
    records = await settings.app.schedules.list(limit=OVERVIEW_ROWS + 1)
    return await rows(settings, records[:OVERVIEW_ROWS], now), len(records) > OVERVIEW_ROWS
