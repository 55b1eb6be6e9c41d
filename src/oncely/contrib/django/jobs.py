"""The code jobs page's rows: each job of `ONCELY["APP"]` with its schedule in words, its
zone, its next slot, its latest due slot and that slot's outcome, and its pause; and the
same latest due slot and outcome for the schedules kept as data on a list page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from ...app import Oncely
from ...model import Claim, Explanation, Pause, ScheduleRecord
from ...schedule import Schedule, default_key, in_words
from ...schedules import schedule_of


def zone_name(schedule: Schedule) -> str:
    """The IANA name of a schedule's zone (UTC for a fixed offset)."""
    zone = schedule.zone
    return zone.key if isinstance(zone, ZoneInfo) else "UTC"


@dataclass(frozen=True)
class JobRow:
    """One code job, as the admin's jobs page shows it (times in the job's zone)."""

    name: str
    words: str
    zone: str
    next_slot: datetime | None
    last_slot: datetime | None
    outcome: str | None
    """The latest due slot's answer (`ran`, `failed`, `missed`, `paused` …: oncely explain's)."""
    sentence: str | None
    pause: Pause | None


async def job_rows(app: Oncely) -> list[JobRow]:
    """Every job of the app, by name: a handful of reads per job (the `explain` of its latest
    due slot) and one for the pauses in force."""
    pauses = await app.pauses()
    now = await app.store.database_time()
    rows = []
    for job in app.registry:
        zone = job.schedule.zone
        upcoming = app.next_slots(job.name, now, 1)
        latest = job.schedule.latest_at_or_before(now)
        explained: Explanation | None = await app.explain(job.name) if latest else None
        rows.append(
            JobRow(
                name=job.name,
                words=in_words(job.schedule),
                zone=zone_name(job.schedule),
                next_slot=upcoming[0].astimezone(zone) if upcoming else None,
                last_slot=explained.slot.astimezone(zone) if explained else None,
                outcome=explained.answer if explained else None,
                sentence=explained.sentence if explained else None,
                pause=pauses.get(job.name),
            )
        )
    return rows


@dataclass(frozen=True)
class ScheduleRuns:
    """A listed schedule's runs: its latest due slot with what it came to, and its last run."""

    latest: str | None
    """`SLOT OUTCOME` (in its zone): `ran`, `running`, an attempt's recorded outcome
    (`failed`, `timeout`, `cancelled`, `overlap`, `missed` …) or `not run`; None when no slot
    has come due since it was added."""
    last: Claim | None
    """The newest claim of its slots: the last slot that ran (or runs)."""


async def schedule_runs(app: Oncely, records: list[ScheduleRecord]) -> dict[str, ScheduleRuns]:
    """The runs of a list page's schedules: two reads for their latest due slots
    (`store.views.slots`), and one more per schedule whose latest slot did not run (its
    newest claim, by the ledger's index): bounded by the page, never by the ledger."""
    now = await app.store.database_time()
    due: dict[str, tuple[str, str, datetime]] = {}
    for rec in records:
        slot = schedule_of(rec).latest_at_or_before(now)
        if slot is not None and slot >= rec.created_at:
            due[rec.name] = (rec.ledger_name, default_key(slot), slot)
    pairs = [(job, key) for job, key, _ in due.values()]
    claims, attempts = await app.store.views.slots(pairs) if pairs else ({}, {})
    found = {}
    for rec in records:
        latest, last = None, None
        if rec.name in due:
            job, key, slot = due[rec.name]
            last = claims.get((job, key))
            outcomes = [a.outcome for a in attempts.get((job, key), []) if a.outcome]
            if last is not None:
                outcome = "ran" if last.finished_at is not None else "running"
            else:
                outcome = outcomes[-1] if outcomes else "not run"
            latest = f"{slot.astimezone(ZoneInfo(rec.tz)).isoformat()} {outcome}"
        if last is None:
            newest = await app.store.claims.history(rec.ledger_name, 1)
            last = newest[0] if newest else None
        found[rec.name] = ScheduleRuns(latest=latest, last=last)
    return found
