"""The listener: Postgres's notifications wake an idle worker (LISTEN kept up while the
worker runs), each answered at this worker's turn (`wakeups.Wakeups` decides; this part keeps
the one timer of those turns and says what the worker answered)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from ...errors import OncelyError
from ...store import WorkerConnections
from ..outage import Outage
from . import timing
from .wakeups import ROLL_CALL, Heard, Wakeups

logger = logging.getLogger("oncely")
PART = "listener"
"""LISTEN, among the parts of a worker that meet an outage."""


class Listener:
    """Hears notifications, wakes the leaser at this worker's turn, and speaks for it."""

    def __init__(
        self, conns: WorkerConnections, wakeups: Wakeups, outage: Outage | None = None
    ) -> None:
        self.conns = conns
        self.wakeups = wakeups
        self.outage = outage or Outage("")
        """The process's database outage, which LISTEN reports to as the part "listener"."""
        self.listening = False
        """Whether notifications wake this worker now (LISTEN up, and its probe came back)."""
        self.woken = asyncio.Event()
        """Set when the leaser should look now (news came, or a turn)."""
        self.roll_call = asyncio.Event()
        """Set when a worker started or stopped: this one's place is read again."""
        self.timer: asyncio.TimerHandle | None = None
        """The timer of the next turn this worker waits for, if any."""
        self._armed: float | None = None

    def notify(self, key: str | None = None) -> None:
        """New tasks may be due (`key`: a notification's; None: this worker's own reason to
        look): the leaser looks at once, or at this worker's turn (see `wakeups`)."""
        heard = self.wakeups.heard(key, time.monotonic())
        if heard is Heard.ROLL_CALL:
            self.roll_call.set()
        elif heard is Heard.WAKE:
            self.woken.set()
        self._arm()

    def _arm(self) -> None:
        """Keep the timer at the next turn this worker waits for."""
        at = self.wakeups.next_turn()
        if at == self._armed:
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._armed = at
        if at is not None:
            wait = max(0.0, at - time.monotonic())
            self.timer = asyncio.get_running_loop().call_later(wait, self._turn_came)

    def _turn_came(self) -> None:
        at, self.timer, self._armed = self._armed, None, None
        if self.wakeups.come(max(time.monotonic(), at or 0.0)):
            self.woken.set()  # the first had no room, or failed: ours now
        self._arm()

    def stop(self) -> None:
        """The worker stops: it waits for no turn any more."""
        self.wakeups.clear()
        self._arm()

    async def say_taken(self, keys: Sequence[str]) -> None:
        """After a lease that came back short: the notifications `keys`, which this worker
        looked at first, are answered (every due task is leased)."""
        try:
            await self.conns.say(self.wakeups.taken(keys))
        except OncelyError as exc:  # the others look at their turns instead
            logger.debug("saying the notifications were answered failed: %s", exc)

    async def say_roll_call(self) -> None:
        """Say that this worker started or stopped: every worker reads its place again."""
        await self.conns.say(ROLL_CALL)

    async def keep_listening(self, closing: asyncio.Event) -> None:
        """Keep LISTEN up while the worker runs: after a failure or a lost connection, try
        again with backoff (the leaser polls every `poll` meanwhile); once it works again,
        look for tasks at once (some may have been enqueued while no one listened). A
        connection refused by a database that is down or restarting is the outage's: said
        once for the process, tried again by its bounded backoff."""
        retry = timing.LISTEN_RETRY_FIRST_S
        outage = self.outage

        def on_refused(exc: BaseException) -> None:
            if self.conns.is_unavailable(exc):
                outage.failed(PART, exc)
            else:
                logger.warning("cannot LISTEN for new tasks (%s); polling", exc)

        while not closing.is_set():
            lost = asyncio.Event()

            def on_lost(lost: asyncio.Event = lost) -> None:
                lost.set()
                self.listening = False
                self.notify()  # the leaser goes back to polling now

            try:
                async with self.conns.listen(self.notify, on_lost, on_refused) as works:
                    if works and not lost.is_set():
                        outage.answered(PART)
                        self.listening = True
                        retry = timing.LISTEN_RETRY_FIRST_S
                        self.notify()
                        await timing.first(closing, lost)
            finally:
                self.listening = False
            if not self.conns.notifies:
                return  # SQLite: polling is all there is
            if outage.failing(PART):
                await timing.first(closing, timeout=outage.backoff(PART))
                continue
            await timing.first(closing, timeout=retry)
            retry = min(retry * 2, timing.LISTEN_RETRY_MAX_S)
