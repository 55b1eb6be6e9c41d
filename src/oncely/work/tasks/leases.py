"""The leases a task worker holds: what its heartbeat renews, and the room they leave."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from ...store import Leased


class Leases:
    """The tasks this worker leased whose outcome is not written yet, and when each lease
    was last taken or renewed."""

    def __init__(self) -> None:
        self.held: dict[int, Leased] = {}
        """Leased tasks whose outcome is not written yet: what the heartbeat renews."""
        self.renewed: dict[int, float] = {}
        """When (monotonic) the statement that last leased or renewed each held task was
        sent: its lease runs at least `lease` seconds from then (the stall watch's measure)."""
        self.decided = 0
        """Held tasks whose outcome waits to be written: they free their room at once."""
        self.room = asyncio.Event()
        """Set when a task ends or its outcome is decided: the leaser may have room."""

    def take(self, items: Iterable[Leased], sent: float | None = None) -> None:
        """Hold `items`, leased by a statement sent at `sent` (monotonic; None: a step,
        whose leases the stall watch does not measure)."""
        for item in items:
            self.held[item.id] = item
            if sent is not None:
                self.renewed[item.id] = sent

    def drop(self, task_id: int) -> None:
        """The task's outcome is written, or its lease is no longer this worker's."""
        self.held.pop(task_id, None)

    def in_flight(self) -> int:
        """Held tasks not decided yet: leased ahead, or running."""
        return len(self.held) - self.decided
