"""A job's last N expected slots, each with its outcome and explanation, from a handful of
bounded reads (the claims of those keys, the records of that window, the pauses, what runs
now) and the pure `explain_slot`: never one query per slot."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..app import Oncely
from ..explain import explain_slot
from ..model import Attempt, Claim, Explanation, Pause, Release
from ..registry import Job
from .render import gather
from .words import ran_before, slot_label, slot_words

MAX_SLOTS = 500
"""The most slots one timeline shows (`?n=`)."""

OUTCOMES = (
    "ran",
    "failed",
    "timed_out",
    "cancelled",
    "paused",
    "missed",
    "running",
    "released",
    "skipped",
    "before_job",
)
"""The colours of a timeline's marks (in words: `words.MARK_WORDS`)."""

_OUTCOME = {
    "ran": "ran",
    "running": "running",
    "failed": "failed",
    "died": "failed",
    "timeout": "timed_out",
    "cancelled": "cancelled",
    "paused": "paused",
    "released": "released",
    "skipped": "skipped",
    "before_job": "before_job",
}


def outcome_of(answer: str) -> str:
    """The timeline colour of an explanation's answer (not run, for whatever reason: missed)."""
    return _OUTCOME.get(answer, "missed")


@dataclass(frozen=True)
class SlotView:
    """One expected slot of a job, as the timeline shows it."""

    at: datetime
    key: str
    outcome: str
    """One of OUTCOMES."""
    explanation: Explanation
    claim: Claim | None
    duplicates: int
    running: Attempt | None

    @property
    def claimer(self) -> str | None:
        if self.claim is not None:
            return self.claim.claimed_by
        return self.running.replica if self.running is not None else None

    @property
    def duration(self) -> float | None:
        return self.claim.duration if self.claim is not None else None

    @property
    def label(self) -> str:
        """The outcome in a few plain words (`given up`, `waiting for retry`)."""
        return slot_label(self.explanation)

    @property
    def words(self) -> str:
        """What became of the slot, in a plain sentence (`words.slot_words`)."""
        return slot_words(self.explanation)

    @property
    def given_up(self) -> bool:
        """Whether the slot's budget is spent: a release or a skip on purpose settles it."""
        return self.claim is None and bool(self.explanation.fields.get("given_up"))

    @property
    def ran_before(self) -> bool:
        """Whether the slot ran once and was released: running it now runs it a second time."""
        return self.claim is None and ran_before(self.explanation) is not None


def expected_slots(job: Job, now: datetime, n: int) -> list[datetime]:
    """The last `n` slots of a job due at or before `now`, oldest first."""
    found: list[datetime] = []
    at: datetime | None = now
    while at is not None and len(found) < n:
        at = job.schedule.latest_at_or_before(at)
        if at is None:
            break
        found.append(at)
        at = at - timedelta(seconds=1)  # slots are whole seconds apart
    return list(reversed(found))


async def timeline(
    app: Oncely, job: Job, now: datetime, n: int, first_seen: datetime | None = None
) -> list[SlotView]:
    """The last `n` slots of `job`, oldest first, each explained with its releases and the
    job's retry budget (`first_seen`: when the job first appeared; a slot before it with no
    record and no release is `before_job`, not missed)."""
    slots = expected_slots(job, now, n)
    if not slots:
        return []
    keys = [job.key_for(s) for s in slots]
    store = app.store
    control = store.control
    claims, now_running, records, duplicates, pauses, released = await gather(
        control.claims(job.name, keys),
        control.running(job.name),
        store.views.window_records(job.name, slots[0], slots[-1]),
        store.views.duplicates_of(job.name, keys),
        control.job_pauses(job.name),
        control.releases(job.name, since=slots[0]),
    )
    releases: dict[str, list[Release]] = {}
    for rel in released:
        releases.setdefault(rel.key, []).append(rel)
    running = {a.key: a for a in now_running}
    alive = {a.id for a in running.values()}
    by_key: dict[str | None, list[Attempt]] = {}
    for r in records:
        if r.outcome is None and r.id in alive:
            r = dataclasses.replace(r, alive=True)
        by_key.setdefault(r.key, []).append(r)
    missed = by_key.get(None, [])
    views = []
    for at, key in zip(slots, keys, strict=True):
        mine = by_key.get(key, []) + [r for r in missed if _covers(r, at)]
        explanation = explain_slot(
            job=job.name,
            key=key,
            slot=at,
            now=now,
            catch_up=job.catch_up,
            claim=claims.get(key),
            records=mine,
            pauses=pauses,
            first_seen=first_seen,
            releases=releases.get(key, ()),
            budget=job.policy.attempts,
        )
        views.append(
            SlotView(
                at=at,
                key=key,
                outcome=outcome_of(explanation.answer),
                explanation=explanation,
                claim=claims.get(key),
                duplicates=duplicates.get(key, 0),
                running=running.get(key),
            )
        )
    return views


@dataclass(frozen=True)
class LastSlot:
    """A job's latest due slot (None: none yet), its outcome (a colour of OUTCOMES), the
    explanation's sentence, and its claim if it ran."""

    at: datetime | None
    outcome: str | None
    sentence: str | None
    claim: Claim | None
    label: str | None = None
    """The outcome in plain words (`words.slot_label`)."""


def counts(views: list[SlotView]) -> dict[str, int]:
    """How many marks of each colour."""
    found = dict.fromkeys(OUTCOMES, 0)
    for v in views:
        found[v.outcome] += 1
    return found


def _covers(record: Attempt, at: datetime) -> bool:
    """Whether a `missed` record's range holds the slot at `at`."""
    if record.outcome != "missed" or record.slot is None:
        return False
    return record.slot <= at <= (record.slot_last or record.slot)


async def last_outcomes(
    app: Oncely,
    jobs: list[Job],
    now: datetime,
    pauses: dict[str, Pause],
    created: dict[str, datetime] | None = None,
) -> list[LastSlot]:
    """Each job's latest due slot, its outcome, its sentence and its claim: three reads for all jobs
    (and one per job whose attempt has no outcome yet: is it still running?). `created`:
    when jobs that are data first existed (a slot before that is `before_job`)."""
    store = app.store
    first_seen = {**await store.control.first_seen_all(), **(created or {})}
    latest = {job.name: job.schedule.latest_at_or_before(now) for job in jobs}
    pairs = [(job.name, job.key_for(at)) for job in jobs if (at := latest[job.name]) is not None]
    claims, records = await store.views.slots(pairs) if pairs else ({}, {})
    found: list[LastSlot] = []
    for job in jobs:
        slot = latest[job.name]
        if slot is None:
            found.append(LastSlot(None, None, None, None))
            continue
        key = job.key_for(slot)
        mine = records.get((job.name, key), [])
        if any(r.outcome is None for r in mine):
            alive = {a.id for a in await store.control.running(job.name, key)}
            mine = [dataclasses.replace(r, alive=r.id in alive) for r in mine]
        pause = pauses.get(job.name)
        explanation = explain_slot(
            job=job.name,
            key=key,
            slot=slot,
            now=now,
            catch_up=job.catch_up,
            claim=claims.get((job.name, key)),
            records=mine,
            pauses=[pause] if pause is not None else [],
            first_seen=first_seen.get(job.name),
            budget=job.policy.attempts,
        )
        claim = claims.get((job.name, key))
        found.append(
            LastSlot(
                slot,
                outcome_of(explanation.answer),
                slot_words(explanation),
                claim,
                slot_label(explanation),
            )
        )
    return found
