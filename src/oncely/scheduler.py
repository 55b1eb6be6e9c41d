"""What is due, and what to do about it: the worker's pure decisions, with no I/O and no sleeps.

The scheduled-job loop (work/jobs.py) hands this module the time and what the ledger says; it
answers with actions: run these slots, these slots were missed, this slot overlaps a running
one. Tests drive it with an injected clock.

Per job the scheduler keeps a *floor*: every slot at or before it is settled (run, handed to a
run, skipped, or reported missed). The floor starts from the ledger, never from memory: the
newest claimed slot of the job, or, for a job with no claims yet, the moment the worker
started (so a new job's first slot is the first one due after the worker starts). Whenever
more than one slot of a job is due at once (the worker started late, the database was down,
the process was suspended or stuck in a long GC), the scheduler asks for the ledger again
before deciding, so slots another replica ran meanwhile are not reported missed.

Catch-up policies, for the slots due between the floor and now:

- ``latest`` (default): run only the newest due slot; the older ones are reported missed.
  A job that ran at 18:00 every Friday and whose workers were all down for two Fridays runs
  once, not twice: most jobs compute "the state as of now", so one run repairs them.
- ``all``: run each due slot, oldest first, at most MAX_CATCH_UP of them (the newest ones);
  for jobs whose every slot matters (a per-hour export).
- ``none``: run a slot only if it is the newest due one and at most NONE_WINDOW late; a
  worker's own delays (lock waits, retries) fit in that window, a stall does not.

``grace`` bounds every policy: a slot more than `grace` late is not run, it is reported
missed. ``overlap="skip"`` (default) reports a slot as overlap-skipped instead of starting it
while this worker knows the job's previous slot is still running (its own attempt, or a slot
it found busy and is still retrying); ``"allow"`` starts it anyway. Uniqueness per slot is
the claim's business and always on.

A slot found busy (someone holds it right now) is not settled: it is retried with a short,
growing, jittered delay until someone claims it or it leaves the catch-up window (older than
`grace`, or NONE_WINDOW for `none`), so a holder that dies mid-run does not lose the slot.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .model import RunStatus
from .registry import Job
from .schedule import EverySchedule

MAX_CATCH_UP = 100
"""`catch_up="all"` runs at most this many missed slots of a job after a stall (the newest)."""
NONE_WINDOW = timedelta(seconds=10)
"""`catch_up="none"` still runs a slot this late: the worker's own lock waits and retries."""
BUSY_RETRY_FIRST = 0.05
"""Seconds before the first retry of a busy slot; the delay doubles up to BUSY_RETRY_MAX."""
BUSY_RETRY_MAX = 1.0
"""The longest wait between two retries of a busy slot, in seconds."""


@dataclass(frozen=True)
class Run:
    """Attempt these slots of the job, in this order (one transaction each)."""

    job: Job
    slots: tuple[datetime, ...]
    retry: bool = False
    """Whether this is a retry of a slot found busy (or unreachable) before."""


@dataclass(frozen=True)
class Missed:
    """Slots of the job that came due but will not be run, with why."""

    job: Job
    count: int
    first: datetime
    last: datetime
    reason: str
    """`grace` (too late), `catch_up` (the policy keeps fewer), `busy` (held past the window)."""


@dataclass(frozen=True)
class OverlapSkipped:
    """A slot not started because the job's previous slot is still running."""

    job: Job
    slot: datetime
    running: datetime | None
    """The slot known to be running, when it is known."""


Action = Run | Missed | OverlapSkipped


@dataclass
class _Pending:
    retry_at: datetime
    tries: int


@dataclass
class JobState:
    """What the scheduler knows about one job (rebuilt from the ledger after a restart)."""

    job: Job
    floor: datetime | None = None
    """Every slot at or before this is settled; None until the ledger was read."""
    next_slot: datetime | None = None
    running: dict[datetime, int] = field(default_factory=dict)
    """Slots with an attempt in flight in this worker (slot -> how many)."""
    pending: dict[datetime, _Pending] = field(default_factory=dict)
    """Slots found busy (or unreachable), with when to try them again."""
    retrying: dict[datetime, int] = field(default_factory=dict)
    """Slots being retried right now, with how many times they were found busy."""
    synced: bool = False
    """Whether the ledger was read since the last time more than one slot came due."""

    def set_floor(self, floor: datetime) -> None:
        self.floor = floor
        self.next_slot = self.job.schedule.next_after(floor)


def window(job: Job) -> timedelta | None:
    """How late a slot of this job may still run: `grace`, and NONE_WINDOW for `none`."""
    if job.catch_up == "none":
        return NONE_WINDOW if job.grace is None else min(job.grace, NONE_WINDOW)
    return job.grace


def due_slots(job: Job, floor: datetime, now: datetime, keep: int) -> tuple[list[datetime], int]:
    """The newest `keep` slots in (floor, now], oldest first, and how many there are in all.

    An `every(...)` schedule is counted by arithmetic, so a long gap (60 days of every
    second: 5 million slots) costs no more than a short one; a cron schedule (at most one
    slot a minute) is walked.
    """
    schedule = job.schedule
    if isinstance(schedule, EverySchedule):
        first, last = schedule.next_after(floor), schedule.latest_at_or_before(now)
        if first is None or last is None or last < first:
            return [], 0
        count = (last - first) // schedule.period + 1
        kept = min(keep, count)
        return [last - (kept - 1 - i) * schedule.period for i in range(kept)], count
    newest: deque[datetime] = deque(maxlen=keep)
    count = 0
    for slot in job.schedule.slots_between(floor, now):
        newest.append(slot)
        count += 1
    return list(newest), count


class Scheduler:
    """The decisions of one worker for a set of jobs, as a pure state machine over time."""

    def __init__(
        self, jobs: Iterable[Job], started: datetime, rng: random.Random | None = None
    ) -> None:
        self.started = started
        self.states = {job.name: JobState(job) for job in jobs}
        self._rng = rng or random.Random()

    # -- the ledger -----------------------------------------------------------------------

    def unsynced(self, now: datetime) -> list[str]:
        """Jobs whose floor must be (re)read from the ledger before deciding at `now`."""
        names = []
        for name, state in self.states.items():
            if state.floor is None:
                names.append(name)
            elif not state.synced and state.next_slot is not None and state.next_slot <= now:
                second = state.job.schedule.next_after(state.next_slot)
                if second is not None and second <= now:
                    names.append(name)  # more than one slot due: a stall; ask the ledger
        return names

    def sync(self, name: str, last_claimed: datetime | None) -> None:
        """Take the ledger's newest claimed slot of a job (None: no claims) as its floor."""
        state = self.states[name]
        floor = state.floor
        if last_claimed is not None and (floor is None or last_claimed > floor):
            floor = last_claimed
        if floor is None:
            floor = self.started  # no claims yet: nothing to catch up
        state.set_floor(floor)
        state.synced = True

    # -- deciding -------------------------------------------------------------------------

    def due(self, now: datetime) -> list[Action]:
        """Everything to do at `now`: runs of due slots, retries, missed and overlap reports."""
        actions: list[Action] = []
        for state in self.states.values():
            actions.extend(self._retries(state, now))
            if state.floor is not None and state.next_slot is not None and state.next_slot <= now:
                actions.extend(self._new_slots(state, now))
        return actions

    def _retries(self, state: JobState, now: datetime) -> list[Action]:
        actions: list[Action] = []
        limit = window(state.job)
        for slot, pending in sorted(state.pending.items()):
            if pending.retry_at > now:
                continue
            del state.pending[slot]
            state.retrying[slot] = pending.tries
            if limit is not None and now - slot > limit:
                del state.retrying[slot]
                actions.append(Missed(state.job, 1, slot, slot, "busy"))
                continue
            state.running[slot] = state.running.get(slot, 0) + 1
            actions.append(Run(state.job, (slot,), retry=True))
        return actions

    def _new_slots(self, state: JobState, now: datetime) -> list[Action]:
        job = state.job
        old_floor = state.floor
        assert old_floor is not None
        keep = MAX_CATCH_UP if job.catch_up == "all" else 1
        slots, count = due_slots(job, old_floor, now, keep)
        state.set_floor(slots[-1])
        state.synced = False
        limit = window(job)
        runnable = [s for s in slots if limit is None or now - s <= limit]
        actions: list[Action] = []
        if count > len(runnable):
            actions.append(_missed(job, old_floor, slots, runnable, count))
        if not runnable:
            return actions
        if job.overlap == "skip" and (state.running or state.pending):
            running = min([*state.running, *state.pending])
            actions.extend(OverlapSkipped(job, s, running) for s in runnable)
            return actions
        for slot in runnable:
            state.running[slot] = state.running.get(slot, 0) + 1
        actions.append(Run(job, tuple(runnable)))
        return actions

    # -- outcomes -------------------------------------------------------------------------

    def finished(
        self,
        job: Job,
        slot: datetime,
        status: RunStatus | None,
        now: datetime,
        retry_at: datetime | None = None,
    ) -> None:
        """Record one attempt's outcome; `busy`, `retry_wait` (the job's retry policy runs it
        later), `unknown` (a commit whose outcome could not be read back) or None (the
        database failed) is retried later: the claim decides. A failed attempt with a
        `retry_at` (the policy's time) is tried again then; `given_up` is settled."""
        state = self.states[job.name]
        count = state.running.get(slot, 0) - 1
        if count > 0:
            state.running[slot] = count
        else:
            state.running.pop(slot, None)
        tries = state.retrying.pop(slot, 0) + 1
        if retry_at is not None:
            state.pending[slot] = _Pending(max(retry_at, now), tries)
        elif status in _TRY_AGAIN or status is None:
            delay = min(BUSY_RETRY_MAX, BUSY_RETRY_FIRST * 2 ** (tries - 1))
            delay *= self._rng.uniform(0.5, 1.5)
            state.pending[slot] = _Pending(now + timedelta(seconds=delay), tries)

    def abandon(self, job: Job, slots: Iterable[datetime]) -> None:
        """Forget in-flight slots that will not be attempted (shutdown)."""
        state = self.states[job.name]
        for slot in slots:
            state.running.pop(slot, None)
            state.retrying.pop(slot, None)

    def next_wake(self) -> datetime | None:
        """The earliest time anything can come due: a job's next slot or a retry."""
        times = [s.next_slot for s in self.states.values() if s.next_slot is not None]
        times.extend(p.retry_at for s in self.states.values() for p in s.pending.values())
        return min(times) if times else None


_TRY_AGAIN = (RunStatus.BUSY, RunStatus.UNKNOWN, RunStatus.RETRY_WAIT)


def _missed(
    job: Job, floor: datetime, kept: list[datetime], runnable: list[datetime], count: int
) -> Missed:
    """One report for every due slot that will not run: how many, the span, and why."""
    unkept = count - len(kept)  # older than the ones kept: counted, not listed
    late = [s for s in kept if s not in runnable]
    first = (job.schedule.next_after(floor) if unkept else late[0]) or kept[0]
    if late:
        last = late[-1]
    else:
        last = job.schedule.latest_at_or_before(kept[0] - timedelta(microseconds=1)) or kept[0]
    reason = "grace" if late else "catch_up"
    return Missed(job, count - len(runnable), first, last, reason)
