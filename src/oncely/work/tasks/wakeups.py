"""Wake-ups: which idle worker answers a notification, and when (the notification turns).

A notification's key (the enqueueing transaction's id, the same for every worker that hears
it) is answered in turns: the live workers, in the order of their ids, take the key's hash as
the first to look, the next one looks TURN_S later, and so on. An enqueued task then wakes
one lease, not every idle worker's at once competing with the one that gets it. If that lease
comes back short (it took every due task), its worker says so (a notification
"taken:SCOPE:KEYS") and the turns of the workers of the same queues and task names (SCOPE)
are cancelled; otherwise (it had no room, it failed, it died) they look at their turns and
take the rest.

Pure: no database, no event loop. Times are the caller's monotonic clock; the listener
(`listener.Listener`) arms one timer at `next_turn()` and calls `come(now)` when it fires.
"""

from __future__ import annotations

import enum
import json
import zlib
from collections.abc import Collection, Sequence

from . import timing

TAKEN = "taken:"
"""The start of a notification's key that says which notifications are answered:
`taken:SCOPE:KEY,KEY,...`, SCOPE naming the queues and task names of the worker that says it
(a worker of other queues or names may have found nothing where this one would not)."""
ROLL_CALL = "workers"
"""A notification's key that says a worker started or stopped: every worker reads its place
among the live workers again at once (not at its next sign of life), so that the turns agree."""


class Heard(enum.Enum):
    """What a worker does about a notification it heard."""

    WAKE = "look now"
    WAIT = "look at its turn, unless it is answered first"
    ROLL_CALL = "read this worker's place among the live workers again"
    NOTHING = "nothing (another scope's word, or a word that turns are answered)"


def scope_of(queues: Collection[str] | None, names: Sequence[str]) -> str:
    """What a worker leases (its queues and task names), as a `taken` message names it."""
    scope = json.dumps([None if queues is None else sorted(queues), list(names)])
    return f"{zlib.crc32(scope.encode()):08x}"


class Wakeups:
    """One worker's side of the notification turns, and the news that may make a task due."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        """What this worker leases, as `scope_of` names it."""
        self.place = (0, 1)
        """(this worker's place among the live workers, how many they are): its turn at a
        notification, read after each sign of life."""
        self.waiting: dict[str, float] = {}
        """The notifications this worker waits for its turn at: key -> when its turn comes."""
        self.answering: list[str] = []
        """The notifications this worker looks at first, not yet said to be answered."""
        self.news = 0
        """Counts what may have made a task due sooner: notifications, outcomes written."""

    def wait(self, key: str) -> float:
        """Seconds this worker waits before it answers the notification `key`."""
        place, count = self.place
        if count <= 1:
            return 0.0
        first = zlib.crc32(key.encode()) % count
        return ((place - first) % count) * timing.TURN_S

    def heard(self, key: str | None, now: float) -> Heard:
        """A notification came (`key`; None: this worker's own reason to look, such as a
        rescue or a LISTEN lost or back): what to do about it, at `now`."""
        if key == ROLL_CALL:
            return Heard.ROLL_CALL  # a worker came or went
        if key is not None and key.startswith(TAKEN):
            scope, _, answered = key[len(TAKEN) :].partition(":")
            if scope == self.scope:  # else its lease did not look where this worker's would
                for one in answered.split(","):
                    self.waiting.pop(one, None)  # the first to look leased all that was due
            return Heard.NOTHING
        wait = self.wait(key) if key is not None else 0.0
        if key is not None and wait > 0:
            self.waiting.setdefault(key, now + wait)
            return Heard.WAIT
        if key is not None and self.place[1] > 1:
            self._answer(key)  # ours to say "taken" of, after our next lease
        self.news += 1  # (a worker alone has no one to say it to)
        return Heard.WAKE

    def come(self, now: float) -> bool:
        """The turns whose time came by `now` are this worker's to answer (the first to look
        had no room, or failed); whether there were any (then look now)."""
        due = [key for key, at in self.waiting.items() if at <= now]
        for key in due:
            del self.waiting[key]
            self._answer(key)
        if due:
            self.news += 1
        return bool(due)

    def next_turn(self) -> float | None:
        """When the next turn this worker waits for comes, or None."""
        return min(self.waiting.values(), default=None)

    def take_answering(self) -> list[str]:
        """The notifications the lease about to begin answers (to say so if it comes back
        short); none are left to answer after it."""
        answering, self.answering = self.answering, []
        return answering

    def taken(self, keys: Sequence[str]) -> str:
        """The payload that says the notifications `keys` are answered (every due task of
        this worker's scope is leased)."""
        return f"{TAKEN}{self.scope}:{','.join(keys)}"

    def outcome_written(self) -> None:
        """An outcome was written: a retry may come due before the next look."""
        self.news += 1

    def clear(self) -> None:
        """The worker stops: it waits for no turn any more."""
        self.waiting.clear()

    def _answer(self, key: str) -> None:
        if len(self.answering) < timing.ANSWERS_AT_MOST:
            self.answering.append(key)
