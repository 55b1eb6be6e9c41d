"""What is due, and what to do about it: the worker's pure decisions, with no I/O and no sleeps.

The scheduled-job loop (work/jobs.py) hands this module the time and what the ledger says; it
answers with actions: run these slots, these slots were missed, this slot overlaps a running
one. Tests drive it with an injected clock.

Per job the scheduler keeps a *floor*: every slot at or before it is decided (run, handed to a
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

Pauses are intervals [paused_at, resumed_at) of a job, handed in by the loop. A slot whose
time lies inside a closed pause is reported paused (never run by the worker); slots before a
pause and after its resume are due as usual, so catch-up across a pause covers both sides.
A slot inside a pause still open is *held*: neither run nor decided, because the resume may
land (its time is the database's clock of its statement, its commit may come later) before
the slot's time. Once the pause is seen closed, the held slots are decided: inside it,
paused; after its resume, due, every one of them (up to MAX_CATCH_UP, within the window),
because a worker was alive and waiting for them.

A slot found busy (someone holds it right now) is not decided: it is retried with a short,
growing, jittered delay until someone claims it or it leaves the catch-up window (older than
`grace`, or NONE_WINDOW for `none`), so a holder that dies mid-run does not lose the slot.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .model import Pause, RunStatus
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
HOLD_POLL = timedelta(seconds=1)
"""While slots are held by an open pause, how often the loop reads the pauses again."""
_TICK = timedelta(microseconds=1)


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


@dataclass(frozen=True)
class Paused:
    """Slots of the job not started because their time lies inside a (closed) pause of it."""

    job: Job
    count: int
    first: datetime
    last: datetime
    pause: Pause
    """The pause they fall in."""


Action = Run | Missed | OverlapSkipped | Paused


@dataclass
class _Pending:
    retry_at: datetime
    tries: int


@dataclass
class JobState:
    """What the scheduler knows about one job (rebuilt from the ledger after a restart)."""

    job: Job
    floor: datetime | None = None
    """Every slot at or before this is decided; None until the ledger was read."""
    next_slot: datetime | None = None
    running: dict[datetime, int] = field(default_factory=dict)
    """Slots with an attempt in flight in this worker (slot -> how many)."""
    pending: dict[datetime, _Pending] = field(default_factory=dict)
    """Slots found busy (or unreachable), with when to try them again."""
    retrying: dict[datetime, int] = field(default_factory=dict)
    """Slots being retried right now, with how many times they were found busy."""
    synced: bool = False
    """Whether the ledger was read since the last time more than one slot came due."""
    pauses: tuple[Pause, ...] = ()
    """The job's pauses that may still cover an undecided slot, oldest first."""
    held_until: datetime | None = None
    """While an open pause holds the next slot: when to look at the pauses again."""

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

    def set_pauses(self, pauses: dict[str, list[Pause]]) -> None:
        """Take the pauses just read (by job); a job missing from `pauses` has none."""
        for name, state in self.states.items():
            state.pauses = tuple(sorted(pauses.get(name, ()), key=lambda p: p.paused_at))

    def wants_pauses(self, now: datetime) -> bool:
        """Whether a job has a slot to decide at `now` (the loop reads the pauses first)."""
        return any(
            s.floor is not None and s.next_slot is not None and s.next_slot <= now
            for s in self.states.values()
        )

    def pause_floor(self) -> datetime | None:
        """The oldest floor: a pause that ended at or before it covers no undecided slot."""
        floors = [s.floor for s in self.states.values() if s.floor is not None]
        return min(floors) if floors else None

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
        horizon = _horizon(state, now)
        keep = MAX_CATCH_UP if job.catch_up == "all" or state.held_until is not None else 1
        paused, slots, count, after = _partition(job, state.pauses, old_floor, horizon, keep)
        newest = max([*slots, *(p.last for p in paused)], default=None)
        actions: list[Action] = list(paused)
        if newest is not None:
            state.set_floor(newest)
            state.synced = False
            if count:
                actions.extend(self._decide(state, after, slots, count, now))
        held = horizon < now and state.next_slot is not None and state.next_slot <= now
        state.held_until = now + HOLD_POLL if held else None  # an open pause holds the next
        return actions

    def _decide(
        self, state: JobState, after: datetime, slots: list[datetime], count: int, now: datetime
    ) -> list[Action]:
        """Catch-up, grace and overlap for the slots kept (of `count` due outside pauses)."""
        job = state.job
        limit = window(job)
        runnable = [s for s in slots if limit is None or now - s <= limit]
        actions: list[Action] = []
        if count > len(runnable):
            actions.append(_missed(job, after, slots, runnable, count))
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
        `retry_at` (the policy's time) is tried again then; `given_up` is decided."""
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

    def adopt_retries(self, found: Iterable[tuple[str, datetime, datetime]]) -> int:
        """Take on slots waiting for their retry policy that another process scheduled (or
        this one, before a restart): (job, slot, retry time) each; tried at the retry time
        like this worker's own retries. Slots already in hand are left as they are; how
        many were taken on."""
        taken = 0
        for name, slot, retry_at in found:
            state = self.states.get(name)
            if state is None or slot in state.pending or slot in state.running:
                continue
            if slot in state.retrying:
                continue
            state.pending[slot] = _Pending(retry_at, 0)
            taken += 1
        return taken

    def abandon(self, job: Job, slots: Iterable[datetime]) -> None:
        """Forget in-flight slots that will not be attempted (shutdown)."""
        state = self.states[job.name]
        for slot in slots:
            state.running.pop(slot, None)
            state.retrying.pop(slot, None)

    def next_wake(self) -> datetime | None:
        """The earliest time anything can come due: a job's next slot or a retry (or, for a
        job whose next slot an open pause holds, the next look at the pauses)."""
        times = [
            s.held_until or s.next_slot for s in self.states.values() if s.next_slot is not None
        ]
        times.extend(p.retry_at for s in self.states.values() for p in s.pending.values())
        return min(times) if times else None


def _horizon(state: JobState, now: datetime) -> datetime:
    """The latest time slots may be decided at `now`: just before an open pause's start."""
    for pause in state.pauses:
        if pause.resumed_at is None and pause.paused_at <= now:
            return pause.paused_at - _TICK
    return now


def _partition(
    job: Job, pauses: tuple[Pause, ...], floor: datetime, horizon: datetime, keep: int
) -> tuple[list[Paused], list[datetime], int, datetime]:
    """The slots in (floor, horizon]: a report for each closed pause holding some; the newest
    `keep` slots outside every pause, oldest first; how many lie outside every pause; and the
    time after which the first of those lies (for the missed report's span)."""
    paused: list[Paused] = []
    gaps: list[tuple[datetime, datetime]] = []  # (after, up to]: the stretches outside pauses
    low = floor
    for pause in pauses:
        if pause.resumed_at is None or pause.resumed_at <= low or pause.paused_at > horizon:
            continue
        start, end = max(low, pause.paused_at - _TICK), min(horizon, pause.resumed_at - _TICK)
        if pause.paused_at - _TICK > low:
            gaps.append((low, pause.paused_at - _TICK))
        inside, n = due_slots(job, start, end, 1)
        if n:
            first = job.schedule.next_after(start) or inside[0]
            paused.append(Paused(job, n, first, inside[-1], pause))
        low = max(low, end)
    if low < horizon:
        gaps.append((low, horizon))
    slots: list[datetime] = []
    count = 0
    for after, upto in reversed(gaps):
        found, n = due_slots(job, after, upto, keep - len(slots))
        slots[:0] = found
        count += n
    return paused, slots, count, gaps[0][0] if gaps else floor


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


def data_slots(
    job: Job, next_slot: datetime, now: datetime
) -> tuple[list[datetime], Missed | None]:
    """What to do with a data schedule whose stored next slot is due at `now`: its slots
    from `next_slot` to `now` under the job's catch-up and grace, as for a code job (the
    slots to run, oldest first; the report of those that will not run, if any)."""
    keep = MAX_CATCH_UP if job.catch_up == "all" else 1
    floor = next_slot - _TICK
    kept, count = due_slots(job, floor, now, keep)
    if not kept:
        return [], None
    limit = window(job)
    runnable = [s for s in kept if limit is None or now - s <= limit]
    missed = _missed(job, floor, kept, runnable, count) if len(runnable) < count else None
    return runnable, missed
