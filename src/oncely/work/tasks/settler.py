"""Settling: writing what the attempts' outcomes left to write, many in one statement, and
logging each outcome once it is in the database.

To settle an outcome is to write its store transition when it did not commit with the task's
work: the ack of a task that made no statement, a retry, a discard, a dead end. A task whose
work committed settled with its own ack (`outcome.left_to_settle` is then None)."""

from __future__ import annotations

import asyncio
import logging
from typing import TypeAlias

from ... import events, tracing
from ...errors import OncelyError
from ...store import Settle, WorkerConnections
from . import timing
from .leases import Leases
from .outcome import LeaseLost, Outcome, event, left_to_settle, traced
from .wakeups import Wakeups

logger = logging.getLogger("oncely")

Spans: TypeAlias = "dict[tuple[int, str], tracing.Span]"
"""The spans of attempts whose outcome is not written yet, by (task id, lease token): a
lease's tasks share its token (tracing)."""


class Settler:
    """Writes outcomes (in the background while the worker consumes, or at once for a step)."""

    def __init__(
        self, conns: WorkerConnections, leases: Leases, wakeups: Wakeups, spans: Spans
    ) -> None:
        self.conns = conns
        self.leases = leases
        self.wakeups = wakeups
        self.spans = spans
        self.pending: list[tuple[Outcome, Settle]] = []
        """Outcomes decided, left to settle."""
        self.to_settle = asyncio.Event()

    def record(self, outcome: Outcome) -> None:
        """An attempt's outcome: logged now if nothing is left to write, else settled soon
        (its task frees its room at once)."""
        pending = left_to_settle(outcome)
        if pending is None:
            self.leases.drop(outcome.item.id)
            self.emit(outcome)
            return
        self.pending.append((outcome, pending))
        self.leases.decided += 1
        self.to_settle.set()
        self.leases.room.set()

    def written(self, outcome: Outcome) -> None:
        """An outcome written in its group's transaction, which committed: logged now."""
        self.leases.drop(outcome.item.id)
        self.emit(outcome)

    def emit(self, outcome: Outcome) -> None:
        """Log an outcome once it is in the database, and end its attempt's span with it."""
        name, text, level, fields = event(outcome)
        span = self.spans.pop((outcome.item.id, outcome.item.token), None)
        with tracing.ended(span, *traced(outcome)):
            events.emit(name, text, level=level, **fields)

    async def settle(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Settle `outcomes` at once (many in one transaction) and log each; the outcomes as
        they ended (LeaseLost where the lease was lost)."""
        pending = [s for o in outcomes if (s := left_to_settle(o)) is not None]
        written = await self.conns.settle(pending) if pending else set()
        final: list[Outcome] = []
        for outcome in outcomes:
            if left_to_settle(outcome) is not None and outcome.item.id not in written:
                outcome = LeaseLost(outcome.item)
            self.leases.drop(outcome.item.id)
            self.emit(outcome)
            final.append(outcome)
        return final

    async def run(self, closing: asyncio.Event) -> None:
        """Settle the recorded outcomes as they come, until `closing`."""
        while not closing.is_set():
            await timing.first(closing, self.to_settle)
            self.to_settle.clear()
            await self.flush(closing)

    async def flush(self, closing: asyncio.Event | None = None, *, once: bool = False) -> None:
        """Write the pending outcomes, many per statement; on a database error, keep them
        and try again (their leases stay renewed meanwhile) until `closing` (`once`: raise)."""
        while self.pending and not (closing is not None and closing.is_set()):
            batch, self.pending = self.pending, []
            try:
                written = await self.conns.settle([s for _, s in batch])
            except OncelyError as exc:
                self.pending[:0] = batch
                if once:
                    raise
                busy = self.conns.is_busy(exc)
                if not busy:
                    logger.debug("writing outcomes failed: %s", exc)
                await timing.first(closing or asyncio.Event(), timeout=0.05 if busy else 1.0)
                continue
            for outcome, pending in batch:
                self.leases.drop(pending.item.id)
                self.leases.decided -= 1
                self.emit(outcome if pending.item.id in written else LeaseLost(pending.item))
            self.wakeups.outcome_written()  # a retry written may come due before the next look
            self.leases.room.set()
