"""Tasks this worker cannot run: of a name it does not register, or whose arguments do not
bind its function (another version of the app enqueued them, e.g. during a rolling deploy).
It hands them back, their attempts uncounted, due again after a delay that grows."""

from __future__ import annotations

import logging

from ... import events
from ...errors import OncelyError
from ...model import UNRUNNABLE
from ...store import Leased, WorkerConnections
from ...tasks import TaskRegistry
from . import timing
from .leases import Leases

logger = logging.getLogger("oncely")


class Unrunnable:
    """Sorts out the leased tasks this worker cannot run and hands them back."""

    def __init__(
        self, conns: WorkerConnections, tasks: TaskRegistry, leases: Leases, worker_id: str
    ) -> None:
        self.conns = conns
        self.tasks = tasks
        self.leases = leases
        self.worker_id = worker_id
        self._turned_away: dict[int, float] = {}
        """The last delay of each task this worker handed back as unrunnable."""

    def runnable(self, leased: list[Leased]) -> list[Leased]:
        """The leased tasks this worker can run: it registers their names and their
        arguments bind its functions."""
        return [item for item in leased if self._why(item) is None]

    def _why(self, item: Leased) -> str | None:
        """Why this worker cannot run `item` (its error as handed back), or None."""
        task = self.tasks.find(item.task)
        if task is None:
            wants, detail = "registers it", f"no task {item.task!r} is registered"
        else:
            unbound = task.unbound(item.args)
            if unbound is None:
                return None
            wants, detail = unbound
        head = f"waiting for a worker whose `{item.task}` {wants}"
        if task is None:
            head = f"waiting for a worker that registers `{item.task}`"
        return (
            f"{UNRUNNABLE}{head} ({self.worker_id} cannot run it: {detail}; handed back uncounted)"
        )

    async def hand_back(self, items: list[Leased]) -> None:
        """Hand back tasks this worker cannot run, their attempts uncounted, due again after
        a delay that doubles each time this worker hands the same task back."""
        by_reason: dict[tuple[str, float], list[Leased]] = {}
        if len(self._turned_away) > timing.TURNED_AWAY_AT_MOST:
            self._turned_away.clear()
        for item in items:
            last = self._turned_away.get(item.id)
            wait = (
                timing.UNRUNNABLE_WAIT_FIRST
                if last is None
                else min(2 * last, timing.UNRUNNABLE_WAIT_MAX)
            )
            self._turned_away[item.id] = wait
            by_reason.setdefault((self._why(item) or UNRUNNABLE, wait), []).append(item)
        for (reason, wait), group in by_reason.items():
            try:
                await self.conns.hand_back_unrunnable(group, wait, reason)
            except OncelyError as exc:  # their leases run out; the rescuer hands them on
                logger.debug("handing back tasks this worker cannot run failed: %s", exc)
            for item in group:
                self.leases.drop(item.id)
                events.emit(
                    "task.handed_back",
                    "this worker cannot run it (another version of the app enqueued it); "
                    "handed back, attempt not counted",
                    level=logging.WARNING,
                    task=item.task,
                    id=item.id,
                    reason=reason.split(" (", 1)[0][len(UNRUNNABLE) :],
                    wait=wait,
                )
