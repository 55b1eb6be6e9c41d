"""The session a job is handed: it refuses to end the transaction oncely owns."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.orm import Session

from ..errors import JobTransactionError

_OWNER = "oncely.owner_finishing"
_VIOLATION = "oncely.violation"
_DRIVER = "oncely.attempt_driver"
_CLAIMED = "oncely.claimed"
_ENDED = "oncely.ended"
_XACT = "oncely.xact"
_PAUSE_READ = "oncely.pause_read"
_LENDER = "oncely.driver_lender"


class AttemptSession(Session):
    """A Session whose commit, rollback and close belong to oncely, not to the job."""

    def _guard(self, what: str) -> None:
        if not self.info.get(_OWNER):
            self.info[_VIOLATION] = what
            raise JobTransactionError(
                f"the job called {what}() on oncely's session; oncely commits the job's work "
                "together with the slot's claim, so a job must not commit, roll back or close "
                "it (raise an exception to roll back)"
            )

    def get_bind(self, *args: Any, **kwargs: Any) -> Any:
        if self.info.get(_ENDED):
            # The job kept its session (a task it started, a closure) past its attempt: the
            # connection may already run another attempt, so nothing may reach it from here.
            raise JobTransactionError(
                "this session belonged to an attempt that has ended; a job may use its "
                "session only until it returns"
            )
        return super().get_bind(*args, **kwargs)

    def commit(self) -> None:
        self._guard("commit")
        super().commit()

    def rollback(self) -> None:
        self._guard("rollback")
        super().rollback()

    def close(self) -> None:
        self._guard("close")
        super().close()


def take_over(session: Session) -> None:
    """Let oncely itself finish the transaction (the job has returned or raised): oncely
    takes the session over from the job."""
    session.info[_OWNER] = True


def end(session: Session) -> None:
    """Refuse every later use of an attempt's session (its connection moves on)."""
    session.info[_ENDED] = True


def set_driver_lender(session: Session, lend: Callable[[], Awaitable[Any]] | None) -> None:
    """Mark a task's session whose transaction oncely holds on the driver: `lend()` begins it
    if need be and returns the driver's connection inside it, without SQLAlchemy's session
    beginning (`asyncpg_connection`); None: no longer (the attempt ended)."""
    if lend is None:
        session.info.pop(_LENDER, None)
    else:
        session.info[_LENDER] = lend


def driver_lender(session: Session) -> Callable[[], Awaitable[Any]] | None:
    """The session's `set_driver_lender`, or None."""
    return session.info.get(_LENDER)


def violation(session: Session) -> Any:
    """What the job tried to do to the transaction (`commit`, …), or None."""
    return session.info.get(_VIOLATION)


def set_attempt_driver(session: Any, driver: Any) -> None:
    """Mark an attempt's session as running on a transaction oncely holds on the driver."""
    session.info[_DRIVER] = driver


def attempt_driver(session: Any) -> Any:
    """The driver connection whose transaction the attempt runs in, or None (SQLAlchemy's)."""
    return session.info.get(_DRIVER)


def mark_claimed(session: Any, job: str, key: str, xid: int | None = None) -> None:
    """Record that the attempt's lock-and-claim claimed (job, key) on the driver, in the
    transaction `xid` (what a lost COMMIT's fate is asked by)."""
    session.info[_CLAIMED] = (job, key)
    session.info[_XACT] = xid


def attempt_xact(session: Any) -> int | None:
    """The id of the attempt's transaction, if its claim read it (Postgres, on the driver)."""
    xid = session.info.get(_XACT)
    return int(xid) if xid is not None else None


def mark_pause_read(session: Any, job: str, slot: Any, paused: bool) -> None:
    """Record what the attempt's lock-and-claim read of the job's pauses at the slot's time:
    whether one holds it (so that the attempt need not ask again in a statement of its own)."""
    session.info[_PAUSE_READ] = (job, slot, paused)


def pause_read(session: Any, job: str, slot: Any) -> bool | None:
    """Whether a pause of `job` holds `slot`, as this attempt's claim read it; None if it
    did not read it."""
    found = session.info.get(_PAUSE_READ)
    if found is None or found[0] != job or found[1] != slot:
        return None
    return bool(found[2])


def claimed_here(session: Any, job: str, key: str) -> bool:
    """Whether this attempt's lock-and-claim claimed exactly (job, key)."""
    return bool(session.info.get(_CLAIMED) == (job, key))
