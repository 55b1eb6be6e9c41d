"""What a task's attempt came to, as values: one type per outcome, one function that maps
"returned, or raised X under policy P" to it, and one store transition (what is left to
settle) and one event each. Pure: the settler (`settler.Settler`) writes them."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ...errors import TaskCancelledError
from ...model import TaskState
from ...retry import Discard, GiveUp, Retry, RetryPolicy
from ...store import Leased, Settle

Event = tuple[str, str, int, dict[str, Any]]
"""A log event: (event, text, level, fields)."""


def error_text(exc: BaseException) -> str:
    """An error as the task row keeps it: its class, message and traceback."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{type(exc).__name__}: {exc}\n{tb}"


@dataclass(frozen=True)
class Succeeded:
    """The task returned; its work and its ack committed together (or its ack alone, if it
    made no statement: `settled` then says whether that ack is still to be written)."""

    item: Leased
    duration: float
    settled: bool = True
    result: str | None = None
    """Its return value as stored (JSON text), or None."""


@dataclass(frozen=True)
class Retried:
    """The task raised; its work rolled back, and it runs again in `wait` seconds."""

    item: Leased
    duration: float
    error: BaseException
    wait: float


@dataclass(frozen=True)
class Discarded:
    """The task raised an error its policy discards on; its work rolled back."""

    item: Leased
    duration: float
    error: BaseException


@dataclass(frozen=True)
class Dead:
    """The task is out of attempts (its last one raised, or its worker died); kept as dead."""

    item: Leased
    duration: float
    reason: str
    error: BaseException | None = None
    text: str | None = None
    """The error recorded when there is no exception (an attempt whose worker died)."""


@dataclass(frozen=True)
class LeaseLost:
    """Another worker took the task over (or an operator discarded it) while this attempt
    ran: nothing of this attempt committed."""

    item: Leased


Outcome = Succeeded | Retried | Discarded | Dead | LeaseLost
"""What a task attempt came to (a slot attempt's is `runner.SlotOutcome`)."""


def decide(
    item: Leased, policy: RetryPolicy, exc: BaseException, duration: float, now: datetime
) -> Retried | Discarded | Dead:
    """What an attempt that raised `exc` comes to under `policy`."""
    decision = policy.decide(exc, item.attempt, now)
    if isinstance(decision, Retry):
        return Retried(item, duration, exc, decision.wait)
    if isinstance(decision, Discard):
        return Discarded(item, duration, exc)
    assert isinstance(decision, GiveUp)
    return Dead(item, duration, decision.reason, exc)


def never_finished(item: Leased, policy: RetryPolicy) -> Dead | None:
    """The outcome of a task leased past its last attempt (the worker of that attempt died
    and its lease ran out), or None if it has an attempt left to run."""
    if item.attempt <= policy.attempts:
        return None
    text = f"LeaseExpired: attempt {item.attempt - 1} of {policy.attempts} never finished"
    return Dead(item, 0.0, "attempts exhausted", None, text)


def left_to_settle(outcome: Outcome) -> Settle | None:
    """The store transition that records an outcome (what settling it writes), or None if
    none is left to write (it committed with the task's work, or the lease was lost)."""
    if isinstance(outcome, Succeeded):
        if outcome.settled:
            return None
        return Settle(outcome.item, TaskState.SUCCEEDED, result=outcome.result)
    if isinstance(outcome, Retried):
        return Settle(outcome.item, TaskState.AVAILABLE, outcome.wait, error_text(outcome.error))
    if isinstance(outcome, Discarded):
        # An operator's cancel ends the task without being one of its failures.
        kept = not isinstance(outcome.error, TaskCancelledError)
        return Settle(outcome.item, TaskState.DISCARDED, None, error_text(outcome.error), kept=kept)
    if isinstance(outcome, Dead):
        text = error_text(outcome.error) if outcome.error is not None else outcome.text
        return Settle(outcome.item, TaskState.DEAD, None, text)
    return None


def _fields(item: Leased, **more: Any) -> dict[str, Any]:
    return {"task": item.task, "id": item.id, "attempt": item.attempt, **more}


def _failure(duration: float, exc: BaseException) -> dict[str, Any]:
    return {"duration_ms": round(duration * 1000, 1), "error": f"{type(exc).__name__}: {exc}"}


def event(outcome: Outcome) -> Event:
    """The one log event of an outcome (once it is in the database)."""
    item = outcome.item
    if isinstance(outcome, Succeeded):
        fields = _fields(item, duration_ms=round(outcome.duration * 1000, 1))
        return (
            "task.succeeded",
            "succeeded",
            logging.DEBUG,
            fields,
        )
    if isinstance(outcome, Retried):
        fields = _fields(item, **_failure(outcome.duration, outcome.error))
        fields["wait"] = round(outcome.wait, 3)
        return (
            "task.retry",
            "failed; rolled back, will retry",
            logging.WARNING,
            fields,
        )
    if isinstance(outcome, Discarded):
        fields = _fields(item, **_failure(outcome.duration, outcome.error))
        return (
            "task.discarded",
            "failed with a discard_on error",
            logging.INFO,
            fields,
        )
    if isinstance(outcome, Dead):
        if outcome.error is None:
            fields = _fields(item, error=outcome.text)
            return (
                "task.dead",
                outcome.reason,
                logging.ERROR,
                fields,
            )
        fields = _fields(item, **_failure(outcome.duration, outcome.error))
        fields["reason"] = outcome.reason
        return (
            "task.dead",
            f"failed; {outcome.reason}; kept as dead",
            logging.ERROR,
            fields,
        )
    return (
        "task.lease_lost",
        "another worker took this task over; this attempt rolled back",
        logging.WARNING,
        _fields(item),
    )


def traced(outcome: Outcome) -> tuple[str, BaseException | str | None]:
    """The outcome as its attempt's span records it: `oncely.outcome`, and the error that
    marks the span failed (None: it did not fail)."""
    if isinstance(outcome, Succeeded):
        return "succeeded", None
    if isinstance(outcome, Retried):
        return "retried", outcome.error
    if isinstance(outcome, Discarded):
        return "discarded", outcome.error
    if isinstance(outcome, Dead):
        return "dead", outcome.error or outcome.text or outcome.reason
    return "lease_lost", "lease lost: another worker took the task over; nothing committed"
