"""A database outage, as one worker process sees it: said once when it starts, once when it
ends, whatever the number of parts (the job loop, the schedule loop, the task leaser, the
LISTEN listener) that meet it and however often each retries.

An outage starts when a part finds the database unreachable (the store's verdict:
`DatabaseUnavailableError`, or `Store.is_unavailable` for an error a job's attempt died of)
while no other part does, and ends when every part that met it has had a statement answered
again. Each part waits between its tries by its own backoff: doubling from
OUTAGE_BACKOFF_FIRST to OUTAGE_BACKOFF_MAX seconds, jittered, reset once it is answered.
"""

from __future__ import annotations

import logging
import random
import time

from .. import events

OUTAGE_BACKOFF_FIRST = 0.25
"""Seconds before a part's first retry after the database became unreachable; doubles."""
OUTAGE_BACKOFF_MAX = 5.0
"""The longest wait between two tries while the database is unreachable (before jitter)."""


class Outage:
    """The database outage of one worker process, shared by its parts (none at first)."""

    def __init__(self, replica: str, *, rng: random.Random | None = None) -> None:
        self.replica = replica
        self.since: float | None = None
        """When the outage began (monotonic), or None while the database answers."""
        self.count = 0
        """Outages this process met (each said once)."""
        self._tries: dict[str, int] = {}
        """The parts that met the outage and are not answered yet: their tries so far."""
        self._rng = rng or random.Random()

    @property
    def active(self) -> bool:
        """Whether a part of this process finds the database unreachable now."""
        return self.since is not None

    def failing(self, part: str) -> bool:
        """Whether `part` found the database unreachable and was not answered since."""
        return part in self._tries

    def failed(self, part: str, exc: BaseException, **fields: object) -> None:
        """`part` found the database unreachable (`exc` says how); the first part to do so
        starts the outage and says so (`worker.db_unavailable`, WARNING)."""
        self._tries.setdefault(part, 0)
        if self.since is not None:
            return
        self.since = time.monotonic()
        self.count += 1
        events.emit(
            "worker.db_unavailable",
            "the database is unreachable; retrying with backoff",
            level=logging.WARNING,
            replica=self.replica,
            part=part,
            error=str(exc),
            **fields,
        )

    def answered(self, part: str) -> None:
        """`part` had a statement answered; the last of the parts that met the outage to be
        answered ends it and says so (`worker.db_reconnected`, WARNING, with its length)."""
        if self._tries.pop(part, None) is None or self._tries or self.since is None:
            return
        down = time.monotonic() - self.since
        self.since = None
        events.emit(
            "worker.db_reconnected",
            "the database is back; catching up",
            level=logging.WARNING,
            replica=self.replica,
            down_ms=round(down * 1000, 1),
        )

    def backoff(self, part: str) -> float:
        """Seconds `part` waits before its next try: doubling from OUTAGE_BACKOFF_FIRST up
        to OUTAGE_BACKOFF_MAX, jittered (x0.5 to x1.5) so replicas do not retry in step."""
        tries = self._tries.get(part, 0)
        if part in self._tries:
            self._tries[part] = tries + 1
        wait = min(OUTAGE_BACKOFF_MAX, OUTAGE_BACKOFF_FIRST * 2.0**tries)
        return wait * self._rng.uniform(0.5, 1.5)
