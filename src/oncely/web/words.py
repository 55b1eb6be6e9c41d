"""Schedules in words, the DST changes ahead in a job's zone, and what became of a slot in
plain words (never an outcome's code name such as `given_up` or `no_worker`)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

from ..fates import JobVerdict
from ..model import Explanation
from ..schedule import Schedule, in_words

__all__ = [
    "Shift",
    "dst_shifts",
    "in_words",
    "ran_before",
    "slot_label",
    "slot_words",
    "verdict_words",
    "zone_name",
]


def zone_name(schedule: Schedule) -> str:
    zone = schedule.zone
    return zone.key if isinstance(zone, ZoneInfo) else "UTC"


@dataclass(frozen=True)
class Shift:
    """A change of a zone's UTC offset: a `gap` (clocks forward) or a `fold` (back)."""

    at: datetime
    """The instant of the change (UTC)."""
    kind: str
    before: timedelta
    after: timedelta
    slots: tuple[datetime, ...]
    """The job's slots within the shifted hour(s) around it (at most a few)."""
    more: bool


@functools.lru_cache(maxsize=256)
def _changes(zone: ZoneInfo, start: datetime, end: datetime) -> tuple[datetime, ...]:
    """The instants in [start, end) at which `zone`'s offset changes (to the minute); kept
    per zone and hour, as the overview asks for every job on every load."""
    return tuple(_walk(zone, start, end))


def _walk(zone: ZoneInfo, start: datetime, end: datetime) -> Iterator[datetime]:
    step = timedelta(hours=1)
    t = start
    while t < end:
        if t.astimezone(zone).utcoffset() != (t + step).astimezone(zone).utcoffset():
            lo, hi = t, t + step
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    hi = mid
            yield hi.replace(second=0, microsecond=0)
        t += step


def dst_shifts(schedule: Schedule, now: datetime, days: int = 30, show: int = 4) -> list[Shift]:
    """The DST gaps and folds of the schedule's zone in the next `days` days, each with the
    job's slots in the hours the change moves (UTC jobs: none)."""
    zone = schedule.zone
    if not isinstance(zone, ZoneInfo) or zone.key == "UTC":
        return []
    start = now.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    shifts = []
    for at in _changes(zone, start, start + timedelta(days=days)):
        before = (at - timedelta(minutes=1)).astimezone(zone).utcoffset() or timedelta(0)
        after = at.astimezone(zone).utcoffset() or timedelta(0)
        width = abs(after - before)
        slots: list[datetime] = []
        more = False
        for slot in schedule.slots_after(at - width - timedelta(microseconds=1)):
            if slot >= at + width:
                break
            if len(slots) >= show:
                more = True
                break
            slots.append(slot)
        kind = "gap" if after > before else "fold"
        shifts.append(Shift(at, kind, before, after, tuple(slots), more))
    return shifts


ANSWER_WORDS = {
    "ran": "ran",
    "running": "running now",
    "not_due": "not due yet",
    "skipped": "skipped on purpose",
    "released": "released",
    "failed": "failed",
    "timeout": "timed out",
    "cancelled": "cancelled",
    "died": "did not finish",
    "paused": "paused",
    "overlap": "skipped: the previous slot still ran",
    "missed": "missed",
    "before_job": "before the job existed",
    "no_worker": "no worker ran it",
}
"""An explanation's answer (`oncely explain`) as a person reads it on a page."""

MARK_WORDS = {
    "ran": "ran",
    "failed": "failed",
    "timed_out": "timed out",
    "cancelled": "cancelled",
    "paused": "paused",
    "missed": "missed",
    "running": "running",
    "released": "released",
    "skipped": "skipped on purpose",
    "before_job": "before the job existed",
}
"""A timeline colour (`timeline.OUTCOMES`) in words: the legend's."""

_ENDED = {"failed": "failed", "timeout": "timed out", "cancelled": "was cancelled", "died": "died"}


def _plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def slot_label(explanation: Explanation) -> str:
    """A slot's outcome in a few plain words: `given up`, `waiting for retry`, `released`."""
    fields = explanation.fields
    if explanation.answer in _ENDED:
        if fields.get("given_up"):
            return "given up"
        if fields.get("retry_at"):
            return "waiting for retry"
    return ANSWER_WORDS.get(explanation.answer, explanation.answer.replace("_", " "))


def slot_words(explanation: Explanation) -> str:
    """What became of a slot, in a sentence for its page: a failed slot's retry and the
    attempts left, a given-up slot's attempts and what settles it, a released slot's run
    and release, a skip's who and why; else `oncely explain`'s sentence."""
    fields, answer = explanation.fields, explanation.answer
    if answer in _ENDED:
        return _ended_words(explanation)
    if answer == "released" and fields.get("releases"):
        return _released_words(explanation)
    if answer == "skipped":
        why = f": {fields['reason']}" if fields.get("reason") else ""
        return f"skipped on purpose by {fields.get('by')} at {fields.get('at')}{why}"
    return explanation.sentence


def _ended_words(explanation: Explanation) -> str:
    fields = explanation.fields
    counted = int(fields.get("attempts_counted") or 0)
    verb = _ENDED[explanation.answer]
    last = _last_attempt(explanation)
    error = ""
    if last is not None and last.get("error_class"):
        error = f": {last['error_class']}: {last.get('error')}"
    if fields.get("given_up"):
        return (
            f"given up after {_plural(counted, 'attempt')} (the last one, by {fields.get('by')} "
            f"at {fields.get('at')}, {verb}{error}): nothing runs it again until an operator "
            "releases it (it runs again) or skips it on purpose (it is settled)"
        )
    if fields.get("retry_at"):
        left = fields.get("attempts_left")
        budget = "" if left is None else f"; {left} of {counted + int(left)} attempts left"
        at = fields["retry_at"]
        return f"waiting for retry at {at} (attempt {counted} {verb}{budget}){error}"
    return f"attempt by {fields.get('by')} at {fields.get('at')} {verb}{error}: the slot is free"


def _last_attempt(explanation: Explanation) -> dict[str, Any] | None:
    attempts = explanation.fields.get("attempts") or []
    ended = [a for a in attempts if a.get("outcome") != "running"]
    return ended[-1] if ended else None


_FREED_RUN = re.compile(r"released \(ran at (\S+) by (.+?)\)")


def ran_before(explanation: Explanation) -> tuple[str, str] | None:
    """(when, by whom) a released slot ran, from its release's audit result or its
    recorded attempt; None: it never ran (it was given up, then released)."""
    if explanation.answer != "released":
        return None
    for release in reversed(explanation.fields.get("releases") or []):
        found = _FREED_RUN.match(str(release.get("result") or ""))
        if found is not None:
            return found.group(1), found.group(2)
    ran = [a for a in explanation.fields.get("attempts") or [] if a.get("outcome") == "ran"]
    return (str(ran[-1]["started_at"]), str(ran[-1]["by"])) if ran else None


def _released_words(explanation: Explanation) -> str:
    fields = explanation.fields
    why = f" ({fields['reason']})" if fields.get("reason") else ""
    freed = f"released by {fields.get('by')} at {fields.get('at')}{why}"
    ran = ran_before(explanation)
    if ran is not None:
        return f"ran at {ran[0]} by {ran[1]}; {freed}: it may run again"
    return f"given up, then {freed}: it may run again"


FATE_WORDS = {
    "ran": "ran",
    "not_due": "not due yet",
    "before_job": "before the job existed",
    "running": "running",
    "skipped": "skipped on purpose",
    "retry_wait": "waiting for retry",
    "released": "released",
    "paused": "paused",
    "overlap": "skipped for overlap",
    "missed": "missed",
    "due": "due now",
    "given_up": "given up",
    "died": "did not finish",
    "unaccounted": "not accounted for",
}
"""A fate of `oncely verify` (oncely.fates) as a person reads it on a page."""


def verdict_words(verdict: JobVerdict) -> str:
    """`JobVerdict.summary()` in plain words: the slots, their fates, the findings."""
    fates = ", ".join(
        f"{n} {FATE_WORDS.get(fate, fate.replace('_', ' '))}"
        for fate, n in sorted(verdict.counts().items(), key=lambda item: -item[1])
    )
    n = len(verdict.findings)
    tail = "all accounted for" if not n else _plural(n, "finding")
    since = ""
    if verdict.widened is not None:
        since = f" since {verdict.widened.isoformat(timespec='seconds')}, its last expected slot"
    return f"{_plural(len(verdict.slots), 'slot')}{since} ({fates or 'none'}): {tail}"
