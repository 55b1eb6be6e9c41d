"""Is every expected slot accounted for? The fate of each slot of a job over a window, and
every finding against the fate model, from what the database recorded. Pure: the app reads
the records and hands them here (`oncely verify`, the dashboard's job page).

A slot's fate, first match wins: ran (a claim; "again after a release" when an operator
released an earlier run) · not_due (later than the database's now) · before_job (before the
job's first appearance, and never attempted nor released) · running (an attempt holds it) ·
skipped (an operator settled it as skipped on purpose, with a reason) · given_up (its retry
budget is spent, it ran past its grace or was cancelled: a finding until an operator
releases or skips it) · retry_wait (its retry policy runs it at `at`) · released (an
operator freed it) · paused (inside a pause) · overlap · missed (a recorded catch-up/grace
note covers it) · due (came due within `leeway` seconds: a worker is about to take it).

A finding is anything the model does not allow: a due slot with no fate (`unaccounted`, or
`died` when its only attempt's process died and nobody ran it again), a slot given up and
not settled (`given_up`), a claim made under a key the job's key function no longer gives
its slot (`key_changed`), two claims of one slot (`doubled`), a slot run again after it was
given up and not released (`rerun`), a slot claimed before it was due (`early`), tasks that
no live worker can run (`unrunnable`), and tasks or slots due with no live worker at all
(`no_worker`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .model import OPERATOR_SKIP, Attempt, Claim, Pause, Release

EARLY = timedelta(seconds=1)
"""A claim this much before its slot's time is `early`. A worker fires by its own clock
corrected to the database's (measured within a round trip), and `oncely run --now T` from an
external scheduler starts at T by that scheduler's clock: a claim a few milliseconds before T
is on time, one a second or more before it ran a slot that was not due."""

LEEWAY = timedelta(seconds=15)
"""A slot due this recently and not yet taken is `due`, not a finding: a worker's tick, a
busy retry or a catch-up is about to take it."""

ACCOUNTED = (
    "ran",
    "not_due",
    "before_job",
    "running",
    "skipped",
    "retry_wait",
    "released",
    "paused",
    "overlap",
    "missed",
    "due",
)
"""The fates a slot may have; any other answer (`given_up`, `died`, `unaccounted`) is a
finding."""


def gives_up(record: Attempt) -> bool:
    """Whether an attempt record gives its slot up for good: the final mark its attempt wrote
    in its own transaction (schema 14), until an operator's release clears it. A crash (a
    lost connection, SIGKILL) writes no mark: its slot is free again."""
    return record.final


def waits_for_retry(record: Attempt, now: datetime) -> bool:
    """Whether an attempt record holds its slot for the job's retry policy (`retry_at`)."""
    return not record.final and record.retry_at is not None and record.retry_at > now


@dataclass(frozen=True)
class SlotFate:
    """One expected slot and what became of it."""

    slot: datetime
    key: str
    fate: str
    """One of ACCOUNTED, or `given_up` / `unaccounted` / `died` (with a finding)."""
    by: str | None = None
    at: datetime | None = None
    detail: str | None = None
    """The recorded reason: the missed rule, the attempt's error, the pause's actor."""


@dataclass(frozen=True)
class Finding:
    """Something the fate model does not allow, with the slot (or tasks) it concerns."""

    kind: str
    job: str | None
    message: str
    slot: datetime | None = None
    key: str | None = None


@dataclass(frozen=True)
class JobLedger:
    """What the app read about one job for a window: its records and its definition."""

    job: str
    slots: Sequence[datetime]
    """The job's schedule's slots in the window, oldest first."""
    key_for: Callable[[datetime], str]
    first_seen: datetime | None
    claims: Sequence[Claim]
    records: Sequence[Attempt]
    pauses: Sequence[Pause]
    releases: Sequence[Release] = ()
    """Each release an operator made, oldest first."""


@dataclass(frozen=True)
class JobVerdict:
    """Every expected slot of one job in the window, with its fate, and the findings."""

    job: str
    slots: tuple[SlotFate, ...]
    findings: tuple[Finding, ...]
    first_seen: datetime | None
    widened: datetime | None = None
    """Where the job's window was moved back to (its last expected slot) when the default
    window held none of its slots (a weekly job, checked by a daily window)."""

    def counts(self) -> dict[str, int]:
        """How many slots of each fate."""
        found: dict[str, int] = {}
        for s in self.slots:
            found[s.fate] = found.get(s.fate, 0) + 1
        return found

    def summary(self) -> str:
        """One line: slots, fates, findings."""
        order = {fate: i for i, fate in enumerate((*ACCOUNTED, "given_up"))}
        counted = sorted(self.counts().items(), key=lambda item: order.get(item[0], len(order)))
        fates = ", ".join(f"{n} {fate}" for fate, n in counted)
        n = len(self.findings)
        tail = "all accounted for" if not n else f"{n} finding{'s' if n != 1 else ''}"
        since = f" since {_at(self.widened)}, its last expected slot" if self.widened else ""
        return f"{self.job}: {len(self.slots)} slots{since} ({fates or 'none'}): {tail}"


@dataclass(frozen=True)
class Verdict:
    """The answer of `oncely verify`: each job's verdict, and findings about no one job."""

    since: datetime
    until: datetime
    now: datetime
    jobs: tuple[JobVerdict, ...]
    findings: tuple[Finding, ...] = field(default=())

    @property
    def all_findings(self) -> list[Finding]:
        return [f for j in self.jobs for f in j.findings] + list(self.findings)

    @property
    def ok(self) -> bool:
        """Whether every slot and task is accounted for."""
        return not self.all_findings

    def as_json(self) -> dict[str, Any]:
        """The verdict as JSON-ready values (`oncely verify --json`)."""
        return {
            "ok": self.ok,
            "since": _iso(self.since),
            "until": _iso(self.until),
            "now": _iso(self.now),
            "jobs": [
                {
                    "job": j.job,
                    "first_seen": _iso(j.first_seen),
                    "since": _iso(j.widened),
                    "counts": j.counts(),
                    "slots": [_slot_json(s) for s in j.slots],
                }
                for j in self.jobs
            ],
            "findings": [_finding_json(f) for f in self.all_findings],
        }


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def _slot_json(s: SlotFate) -> dict[str, Any]:
    return {
        "slot": _iso(s.slot),
        "key": s.key,
        "fate": s.fate,
        "by": s.by,
        "at": _iso(s.at),
        "detail": s.detail,
    }


def _finding_json(f: Finding) -> dict[str, Any]:
    return {"kind": f.kind, "job": f.job, "slot": _iso(f.slot), "key": f.key, "message": f.message}


# -- one job ------------------------------------------------------------------------------


@dataclass
class _Index:
    """A job's records by slot, built once per verdict."""

    claims_by_slot: dict[datetime, list[Claim]]
    claims_by_key: dict[str, Claim]
    records_by_key: dict[str, list[Attempt]]
    missed: list[Attempt]
    releases: dict[str, list[Release]]

    @classmethod
    def of(cls, ledger: JobLedger) -> _Index:
        by_slot: dict[datetime, list[Claim]] = {}
        for c in ledger.claims:
            if c.scheduled_for is not None:
                by_slot.setdefault(c.scheduled_for, []).append(c)
        records: dict[str, list[Attempt]] = {}
        for r in ledger.records:
            if r.key is not None:
                records.setdefault(r.key, []).append(r)
        releases: dict[str, list[Release]] = {}
        for release in ledger.releases:
            releases.setdefault(release.key, []).append(release)
        return cls(
            claims_by_slot=by_slot,
            claims_by_key={c.key: c for c in ledger.claims},
            records_by_key=records,
            missed=[r for r in ledger.records if r.outcome == "missed" and r.slot is not None],
            releases=releases,
        )


def verify_job(
    ledger: JobLedger, now: datetime, leeway: timedelta = LEEWAY, widened: datetime | None = None
) -> JobVerdict:
    """The fate of each slot of `ledger.slots`, and the findings, at database time `now`
    (`widened`: where the app moved the job's window back to, to hold its last slot)."""
    index = _Index.of(ledger)
    fates: list[SlotFate] = []
    findings: list[Finding] = []
    for slot in ledger.slots:
        key = ledger.key_for(slot)
        fate, found = _slot(ledger, index, slot, key, now, leeway)
        fates.append(fate)
        findings.extend(found)
    return JobVerdict(ledger.job, tuple(fates), tuple(findings), ledger.first_seen, widened)


def _slot(
    ledger: JobLedger, index: _Index, slot: datetime, key: str, now: datetime, leeway: timedelta
) -> tuple[SlotFate, list[Finding]]:
    claims = _claims_of(index, slot, key)
    records = index.records_by_key.get(key, [])
    if claims:
        return _ran(ledger, index, slot, key, claims, records)
    if slot > now:
        return SlotFate(slot, key, "not_due"), []
    before = ledger.first_seen is None or slot < ledger.first_seen
    if before and not records and key not in index.releases:  # never tried, never freed
        return SlotFate(slot, key, "before_job", at=ledger.first_seen), []
    fate = _not_run(ledger, index, slot, key, records, now)
    if fate is not None and fate.fate == "given_up":
        message = (
            f"{ledger.job} slot {_at(slot)} did not run: {fate.detail}; `oncely release "
            f"{ledger.job} {key}` runs it again, `oncely skip {ledger.job} {key} --reason "
            "TEXT` settles it as skipped on purpose"
        )
        return fate, [Finding("given_up", ledger.job, message, slot, key)]
    if fate is not None:
        return fate, []
    if now - slot <= leeway:
        return SlotFate(slot, key, "due"), []
    return _unaccounted(ledger.job, slot, key, records)


def _claims_of(index: _Index, slot: datetime, key: str) -> list[Claim]:
    """Every claim of the slot: under its key now, and under any key at its time."""
    found = list(index.claims_by_slot.get(slot, []))
    by_key = index.claims_by_key.get(key)
    if by_key is not None and by_key not in found:
        found.append(by_key)
    return found


def _ran(
    ledger: JobLedger,
    index: _Index,
    slot: datetime,
    key: str,
    claims: list[Claim],
    records: list[Attempt],
) -> tuple[SlotFate, list[Finding]]:
    first = min(claims, key=lambda c: c.claimed_at)
    job = ledger.job
    findings: list[Finding] = []
    when = _at(slot)
    if len(claims) > 1:
        keys = ", ".join(c.key for c in claims)
        findings.append(
            Finding(
                "doubled", job, f"{job} slot {when} ran {len(claims)} times ({keys})", slot, key
            )
        )
    for c in claims:
        if c.key != key:
            findings.append(
                Finding(
                    "key_changed",
                    job,
                    f"{job} slot {when} was claimed under key {c.key!r}; its key is {key!r} "
                    "now (the key function changed): it can run again under the new key",
                    slot,
                    c.key,
                )
            )
        if c.claimed_at < slot - EARLY:
            findings.append(
                Finding(
                    "early",
                    job,
                    f"{job} slot {when} was claimed at {_at(c.claimed_at)}, before it was due",
                    slot,
                    c.key,
                )
            )
    releases = index.releases.get(key, [])
    given = _given_up(records, releases, before=first.claimed_at)
    if given is not None:
        findings.append(
            Finding(
                "rerun",
                job,
                f"{job} slot {when} ran (by {first.claimed_by} at {_at(first.claimed_at)}) after "
                f"it was given up ({given.outcome} by {given.replica}) and not released",
                slot,
                key,
            )
        )
    earlier = [r for r in releases if r.at <= first.claimed_at]
    detail = f"again after {_released(earlier[-1])}" if earlier else None
    fate = SlotFate(slot, key, "ran", by=first.claimed_by, at=first.claimed_at, detail=detail)
    return fate, findings


def _released(release: Release) -> str:
    """'released (ran at T by R) by X at T2 (reason)': what an operator's release freed."""
    why = f" ({release.reason})" if release.reason else ""
    return f"{release.result} by {release.actor} at {_at(release.at)}{why}"


def _given_up(
    records: Sequence[Attempt], releases: Sequence[Release], before: datetime | None = None
) -> Attempt | None:
    """The newest final end record of the slot not released since (ended before `before`)."""
    for r in reversed(records):
        if not gives_up(r) or r.finished_at is None:
            continue
        if before is not None and r.finished_at > before:
            continue
        # A release clears the marks it frees, so a final mark still there came after it;
        # a release is only read as later when its time (to the second on SQLite) is.
        if any(rel.at > r.finished_at for rel in releases):
            return None
        return r
    return None


def budget_spent(records: Sequence[Attempt]) -> int:
    """How many failed attempts a slot's retry budget counts now (a release clears them)."""
    return sum(1 for r in records if (r.final or r.retry_at) and r.outcome != OPERATOR_SKIP)


def _not_run(
    ledger: JobLedger,
    index: _Index,
    slot: datetime,
    key: str,
    records: list[Attempt],
    now: datetime,
) -> SlotFate | None:
    """The recorded reason a due slot did not run, if there is one."""
    running = [r for r in records if r.outcome is None and r.alive]
    if running:
        return SlotFate(slot, key, "running", by=running[-1].replica, at=running[-1].started_at)
    releases = index.releases.get(key, [])
    given = _given_up(records, releases)
    if given is not None and given.outcome == OPERATOR_SKIP:
        by, at = given.replica, given.finished_at
        return SlotFate(slot, key, "skipped", by=by, at=at, detail=given.error or "on purpose")
    if given is not None:
        n = budget_spent(records)
        tried = f"after {n} attempt{'s' if n != 1 else ''}" if n else "after its attempt"
        why = given.outcome if not given.error else f"{given.outcome}: {given.error}"
        detail = f"given up {tried} ({why})"
        return SlotFate(
            slot, key, "given_up", by=given.replica, at=given.finished_at, detail=detail
        )
    waiting = [r for r in records if waits_for_retry(r, now)]
    if waiting:
        w = waiting[-1]
        n = budget_spent(records)
        detail = f"attempt {n} failed ({w.error}); its retry policy runs it again"
        return SlotFate(slot, key, "retry_wait", by=w.replica, at=w.retry_at, detail=detail)
    released = [r for r in records if r.outcome == "ran"]
    if released or releases:
        if releases:
            rel = releases[-1]
            return SlotFate(slot, key, "released", by=rel.actor, at=rel.at, detail=_released(rel))
        at = released[-1].finished_at
        return SlotFate(slot, key, "released", at=at, detail="freed by an operator")
    return _skipped(ledger, index, slot, key, records)


def _skipped(
    ledger: JobLedger, index: _Index, slot: datetime, key: str, records: list[Attempt]
) -> SlotFate | None:
    """Paused, overlap-skipped or missed by policy, from the pauses and the notes."""
    for p in reversed(ledger.pauses):
        if p.paused_at <= slot and (p.resumed_at is None or slot < p.resumed_at):
            held = "held: the pause is still open" if p.resumed_at is None else p.reason
            return SlotFate(slot, key, "paused", by=p.paused_by, at=p.paused_at, detail=held)
    overlaps = [r for r in records if r.outcome == "overlap"]
    if overlaps:
        o = overlaps[-1]
        return SlotFate(slot, key, "overlap", by=o.replica, at=o.recorded_at)
    for m in reversed(index.missed):
        assert m.slot is not None
        if m.slot <= slot <= (m.slot_last or m.slot):
            rule = m.error or "catch_up"
            return SlotFate(slot, key, "missed", by=m.replica, at=m.recorded_at, detail=rule)
    return None


def _unaccounted(
    job: str, slot: datetime, key: str, records: list[Attempt]
) -> tuple[SlotFate, list[Finding]]:
    died = [r for r in records if r.outcome is None and r.started_at is not None]
    when = _at(slot)
    if died:
        d = died[-1]
        message = (
            f"{job} slot {when} did not run: its attempt by {d.replica} died and nobody ran "
            "it again"
        )
        return SlotFate(slot, key, "died", by=d.replica, at=d.started_at), [
            Finding("died", job, message, slot, key)
        ]
    message = f"{job} slot {when} was due and neither ran nor was skipped for a recorded reason"
    return SlotFate(slot, key, "unaccounted"), [Finding("unaccounted", job, message, slot, key)]


def _at(t: datetime) -> str:
    return t.isoformat(timespec="seconds") if t.microsecond == 0 else t.isoformat()


def unrunnable_findings(unrunnable: Mapping[str, int] | None) -> list[Finding]:
    """One finding per task name whose waiting tasks no live worker can run."""
    found = []
    for name, n in sorted((unrunnable or {}).items()):
        message = (
            f"{n} task{'s' if n != 1 else ''} {name!r} wait{'' if n != 1 else 's'} and no live "
            "worker can run them (none registers that name)"
        )
        found.append(Finding("unrunnable", None, message))
    return found


def no_worker_findings(waiting: tuple[int, datetime] | None) -> list[Finding]:
    """A finding for the tasks that came due while no worker at all is live: they wait, and
    nothing will run them until a worker starts."""
    if waiting is None:
        return []
    n, oldest = waiting
    message = (
        f"{n} task{'s' if n != 1 else ''} due since {_at(oldest)} wait{'' if n != 1 else 's'} "
        "and no worker is live (none announced itself lately): nothing runs them until an "
        "`oncely worker` starts"
    )
    return [Finding("no_worker", None, message)]
