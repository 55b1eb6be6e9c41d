"""Running one attempt: a leased task's body in a transaction of its own, to one outcome.

An async task runs on the event loop, its transaction on a connection of the worker's pool
taken at its first statement; its work and its ack commit together. A plain `def` task runs
in the worker's thread pool on a synchronous session. A failure rolls back that task's
transaction alone."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from ... import clock, events, tracing
from ...errors import JobTransactionError
from ...retry import DEFAULT_POLICY
from ...store import Fence, Leased, WorkerConnections
from ...tasks import Task, TaskRegistry, encode_result
from ..options import WorkerOptions
from ..sync_task import SyncCall, run_sync_attempt
from .outcome import LeaseLost, Outcome, Succeeded, decide, never_finished
from .settler import Spans


class AttemptRunner:
    """Runs one leased task at a time per call; shares the worker's pool and threads."""

    def __init__(
        self,
        conns: WorkerConnections,
        tasks: TaskRegistry,
        options: WorkerOptions,
        spans: Spans,
    ) -> None:
        self.conns = conns
        self.tasks = tasks
        self.options = options
        self.spans = spans
        """Each attempt's span, ended with its outcome's event (`Settler.emit`)."""
        self._threads: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Let the threads of sync tasks go (a thread still running ends on its own)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None

    async def run(self, item: Leased) -> Outcome:
        """Run one leased task in its own transaction: its outcome (written already if its
        work committed with its ack; else see `outcome.left_to_settle`)."""
        span = tracing.task_attempt(item.task, item.id, item.attempt, item.queue, item.trace)
        if span is None:
            return await self._run(item)
        self.spans[item.id, item.token] = span
        try:
            with tracing.current(span):
                return await self._run(item)
        except BaseException as exc:  # cancelled (shutdown, operator) or a simulated crash
            del self.spans[item.id, item.token]
            stopped = "cancelled" if isinstance(exc, asyncio.CancelledError) else "crashed"
            with tracing.ended(span, stopped, exc):
                raise

    async def _run(self, item: Leased) -> Outcome:
        task = self.tasks.find(item.task)
        policy = task.retry if task is not None else DEFAULT_POLICY
        ended = never_finished(item, policy)
        if ended is not None:
            return ended
        _emit("task.started", "started", item)
        started = time.perf_counter()
        eager = False
        while True:
            tx = self.conns.transaction(item, self.options.pool_size, eager=eager)
            try:
                try:
                    if task is None:
                        raise LookupError(f"no task {item.task!r} is registered in this worker")
                    if task.is_async:
                        value = await self.call(task, tx.session, item.args)
                        result = encode_result(value, task.name, task.limits.max_result)
                        committed = await tx.commit(result)
                    else:
                        committed, result = await self._in_thread(task, item, eager)
                finally:
                    await tx.close()
            except Exception as exc:
                if not eager and self.conns.is_conflict(exc):
                    eager = True  # another writer, not the task: once more, lock first
                    _emit(
                        "task.conflict",
                        "its transaction met another writer; rolled back, running it again",
                        item,
                    )
                    continue
                return decide(item, policy, exc, time.perf_counter() - started, clock.utcnow())
            duration = time.perf_counter() - started
            if committed is False:
                return LeaseLost(item)
            return Succeeded(item, duration, settled=committed is True, result=result)

    async def call(self, task: Task, session: AsyncSession, args: dict[str, Any]) -> Any:
        """Call an async task's body on `session` (within its timeout, if it has one); its
        value, or what it raised (a use of oncely's session it may not make, too)."""
        call = task.func(session, **args)
        if task.timeout is not None:
            value = await asyncio.wait_for(call, task.timeout)
        else:
            value = await call
        what = self.conns.violation(session.sync_session)
        if what is not None:
            raise JobTransactionError(f"the task called {what}() on oncely's session")
        return value

    async def _in_thread(
        self, task: Task, item: Leased, eager: bool
    ) -> tuple[bool | None, str | None]:
        """Run a plain `def` task in the worker's thread pool, in its own transaction on a
        synchronous connection, so that it blocks no other task, heartbeat or slot. A timeout,
        a cancel or a shutdown gives the attempt up at once: the thread may run on (Python
        cannot stop it), but it never commits (its `Fence`)."""
        if self._threads is None:
            size = min(self.options.concurrency, self.options.pool_size)
            self._threads = ThreadPoolExecutor(size, thread_name_prefix="oncely-task")
        fence = Fence()
        call: SyncCall
        hook = task.attempt
        encode = functools.partial(encode_result, task=task.name, limit=task.limits.max_result)
        if hook is not None:  # an integration's own transaction (Django's)
            stored: list[str | None] = [None]

            def ack(value: Any) -> tuple[Any, dict[str, Any]]:  # at the ack: SQLite's "now"
                stored[0] = encode(value)  # is the host's, read then
                return self.conns.ack_one(item, stored[0])

            def call() -> tuple[bool | None, str | None]:
                return hook(item, ack, fence), stored[0]

        else:
            call = functools.partial(
                run_sync_attempt, self.conns, task.func, item, fence, encode, eager=eager
            )
        future: asyncio.Future[tuple[bool | None, str | None]]
        in_context = functools.partial(contextvars.copy_context().run, call)  # the span's
        future = asyncio.get_running_loop().run_in_executor(self._threads, in_context)
        future.add_done_callback(_retrieved)
        try:
            if task.timeout is None:
                return await asyncio.shield(future)
            return await asyncio.wait_for(asyncio.shield(future), task.timeout)
        except BaseException:
            fence.close()  # it waits for a commit under way: then that commit stands
            if future.done() and not future.cancelled() and future.exception() is None:
                return future.result()
            raise


def _emit(name: str, text: str, item: Leased) -> None:
    events.emit(name, text, level=logging.DEBUG, task=item.task, id=item.id, attempt=item.attempt)


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A sync task's thread ended after its attempt was given up: its result is nobody's."""
    if not future.cancelled():
        future.exception()
