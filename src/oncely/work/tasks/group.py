"""Running a group: leased async tasks one after another on one connection, in one
transaction, a savepoint each, one COMMIT for all (`WorkerOptions.group`; the store's
`TaskGroup` holds the transaction).

Each task's work and its ack land with the group's COMMIT, or not at all. A task that raises
is rolled back to its savepoint and its retry or end is written in the same transaction; a
task whose lease was lost is rolled back to its savepoint and not acked; its neighbours go
on. If the group's transaction fails as a whole (its COMMIT, its connection), nothing of it
landed and the lanes run each of its tasks again, on its own (`Lanes`)."""

from __future__ import annotations

import logging
import time

from ... import clock, events, tracing
from ...store import GroupMember, Leased, TaskGroup, WorkerConnections
from ...tasks import Task, TaskRegistry, encode_result
from ..options import WorkerOptions
from .attempt import AttemptRunner
from .outcome import LeaseLost, Outcome, Succeeded, decide, left_to_settle, never_finished
from .settler import Spans

Ended = tuple[Outcome, bool]
"""A task's outcome in its group, and whether it was written in the group's transaction (a
failure of a task that made a statement; an ack is written there too, and needs nothing
more either way)."""


class GroupRunner:
    """Runs groups of leased tasks; shares the worker's pool and spans."""

    def __init__(
        self,
        conns: WorkerConnections,
        tasks: TaskRegistry,
        options: WorkerOptions,
        spans: Spans,
        attempts: AttemptRunner,
    ) -> None:
        self.conns = conns
        self.tasks = tasks
        self.options = options
        self.spans = spans
        self.attempts = attempts
        self._possible: bool | None = None

    def possible(self) -> bool:
        """Whether this worker runs groups: asked for (`group` > 1), and the store's pool can
        hold them (Postgres on asyncpg; not SQLite, whose write lock a group would hold for
        all its tasks)."""
        if self._possible is None:
            wanted = self.options.group > 1
            self._possible = wanted and self.conns.can_group(self.options.pool_size)
        return self._possible

    def groupable(self, item: Leased) -> bool:
        """Whether a leased task may run in a group: an async task without a timeout (a
        timeout would cancel it mid-group) nor an integration's own transaction. A plain
        `def` task runs in a thread on a connection of its own."""
        task = self.tasks.find(item.task)
        return task is not None and task.is_async and task.timeout is None and task.attempt is None

    async def run(self, items: list[Leased]) -> list[Ended]:
        """Run `items` in one transaction, in order: each one's outcome, once the group's
        COMMIT landed. Raises (nothing of the group committed) if the transaction failed as a
        whole, or the run was cancelled."""
        spans = {item.id: self._span(item) for item in items}
        group = self.conns.group(self.options.pool_size)
        ended: list[Ended] = []
        try:
            for item in items:
                with tracing.current(spans[item.id]):
                    ended.append(await self._member(group, item))
            await group.commit()
        except BaseException as exc:
            for item in items:  # nothing of the group committed: no outcome is written
                span = self.spans.pop((item.id, item.token), None)
                with tracing.ended(span, "rolled_back", exc):
                    pass
            raise
        finally:
            await group.close()
        return ended

    def _span(self, item: Leased) -> tracing.Span | None:
        span = tracing.task_attempt(item.task, item.id, item.attempt, item.queue, item.trace)
        if span is not None:
            self.spans[item.id, item.token] = span
        return span

    async def _member(self, group: TaskGroup, item: Leased) -> Ended:
        task = self.tasks.find(item.task)
        assert task is not None  # `groupable`
        ended = never_finished(item, task.retry)
        if ended is not None:
            return ended, False
        events.emit(
            "task.started",
            "started",
            level=logging.DEBUG,
            task=item.task,
            id=item.id,
            attempt=item.attempt,
            grouped=True,
        )
        started = time.perf_counter()
        member = group.member(item)
        try:
            try:
                value = await self.attempts.call(task, member.session, item.args)
                result = encode_result(value, task.name, task.limits.max_result)
                acked = await member.ack(result)
            except Exception as exc:
                await member.undo()  # raises if the connection is gone: the group fails
                return await self._failed(group, member, task, exc, time.perf_counter() - started)
        finally:
            await member.close()
        duration = time.perf_counter() - started
        if acked is False:
            return LeaseLost(item), True
        return Succeeded(item, duration, settled=acked is True, result=result), acked is True

    async def _failed(
        self, group: TaskGroup, member: GroupMember, task: Task, exc: Exception, duration: float
    ) -> Ended:
        """A task of the group raised (its work rolled back to its savepoint): its retry or
        end, written in the group's transaction if it made a statement (else the settler
        writes it, as for a task on its own)."""
        item = member.item
        outcome = decide(item, task.retry, exc, duration, clock.utcnow())
        settle = left_to_settle(outcome)
        assert settle is not None
        if not member.touched:
            return outcome, False
        written = await group.record(settle)
        return (outcome if written else LeaseLost(item)), True
