"""One definition, two executors: an operation written once as the statements it runs.

A plan is a generator that yields `(statement, parameters)` and is sent each statement's
result (a statement's error is raised inside the plan, where it may translate it); what
it returns is the operation's answer. `run` executes a plan on a synchronous
Session or Connection, `run_async` on an AsyncSession or AsyncConnection: the statements and
their parameters are built in one place, and only the awaiting differs.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

T = TypeVar("T")

Step = tuple[Any, Any]
"""A statement and its parameters (a dict, a list of dicts for executemany, or None)."""
Plan = Generator[Step, Any, T]


def run(session: Any, plan: Plan[T]) -> T:
    """Execute a plan's statements on a synchronous Session or Connection; its answer."""
    try:
        step = next(plan)
        while True:
            try:
                result = session.execute(*step)
            except Exception as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run_async(session: Any, plan: Plan[T]) -> T:
    """Execute a plan's statements on an AsyncSession or AsyncConnection; its answer."""
    try:
        step = next(plan)
        while True:
            try:
                result = await session.execute(*step)
            except Exception as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
