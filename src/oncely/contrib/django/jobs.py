"""The code jobs page's rows: each job of `ONCELY["APP"]` with its schedule in words, its
zone, its next slot, its latest due slot and that slot's outcome, and its pause."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ...app import Oncely
from ...model import Explanation, Pause
from ...web.words import in_words, zone_name


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
