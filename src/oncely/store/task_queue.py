"""The task queue's side of the store: enqueue in the caller's transaction, leases, acks.

A worker runs each leased task in a transaction of its own (TaskTransaction): the task's
statements and its ack, a compare-and-set on (id, lease_token), commit together or not at
all, so each task's work lands once. The transaction takes a connection of the worker's pool
at the task's first statement and returns it at its end; a task that makes no statement
takes none, and its ack (or a failed task's retry or end, after its work rolled back) is a
`Settle`, which the worker writes for many tasks in one short transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.util import await_only

from .. import clock, hooks
from ..errors import JobTransactionError, OncelyError
from ..model import TaskRecord, TaskState
from . import tables, task_queue_sql
from .database import Database
from .dialect import Dialect, raise_translated
from .dialects import dialect_for, driver_dialect
from .plan import Plan, Step, run, run_async
from .rows import record
from .session import AttemptSession, end, set_driver_lender, take_over, violation
from .task_connections import TaskPool


@dataclass(frozen=True)
class Leased:
    """A task this worker holds a lease on: one attempt to run."""

    id: int
    task: str
    args: dict[str, Any]
    attempt: int
    queue: str
    token: str
    trace: str | None = None
    """The trace context it was enqueued in (the propagator's headers as JSON), or None."""
    counted: bool = True
    """Whether `attempt` counts this attempt already: the lease counts the tasks that start
    at once; a task leased ahead is counted when its body starts (`begin_attempts`)."""


_LIMITS = [(c, pt) for c, pt in task_queue_sql.LIMIT_PARAMS.items() if c != "priority"]


def _params(dialect: Dialect, entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    now = None if dialect.database_clock else clock.utcnow()
    now_params = dialect.now_params()
    params = []
    for entry in entries:
        run_at = entry.get("run_at")
        delay = float(entry.get("delay") or 0.0)
        if run_at is None and now is not None:
            run_at = now + timedelta(seconds=delay)
        params.append(
            {
                "p_task": entry["task"],
                "p_queue": entry["queue"],
                "p_args": entry["args"],
                "p_key": entry.get("idempotency_key"),
                "p_run_at": run_at,
                "p_delay": delay,
                "p_priority": entry.get("priority", 0),
                "p_trace": entry.get("trace"),
                **{p: entry.get(column) for column, (p, _) in _LIMITS},
                **now_params,
            }
        )
    return params


_CHUNK = 1000  # rows per INSERT: well under the drivers' bind-parameter limits


def _chunks(rows: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(rows), _CHUNK):
        yield rows[start : start + _CHUNK]


_FRESH = {f.name: f.default for f in dataclasses.fields(TaskRecord)} | {
    "state": TaskState.AVAILABLE,
    "attempt": 0,
}


def _fresh(row: Any, entry: dict[str, Any]) -> TaskRecord:
    # A frozen dataclass's __init__ sets its 15 fields with one object.__setattr__ each
    # (2 us a record, as much as the rest of an enqueue_many per task); a new task's record
    # gets the same fields in one dict update.
    rec = object.__new__(TaskRecord)
    rec.__dict__.update(
        _FRESH,
        id=row.id,
        task=entry["task"],
        queue=entry["queue"],
        args=entry["args"],
        run_at=row.run_at,
        created_at=row.created_at,
        idempotency_key=entry.get("idempotency_key"),
        priority=entry.get("priority", 0),
    )
    return rec


def _merge(
    entries: Sequence[dict[str, Any]], inserted: list[Any], existing: list[Any]
) -> list[TaskRecord]:
    """The records in the order of `entries`: new rows, then the existing ones for known keys."""
    new_keyed = {(r.task, r.idempotency_key): r for r in inserted if r.idempotency_key}
    old_keyed = {(r.task, r.idempotency_key): record(r, duplicate=True) for r in existing}
    unkeyed = iter(sorted((r for r in inserted if not r.idempotency_key), key=lambda r: r.id))
    out = []
    done: dict[tuple[str, str], TaskRecord] = {}
    for entry in entries:
        key = entry.get("idempotency_key")
        if key is None:
            out.append(_fresh(next(unkeyed), entry))
            continue
        pair = (entry["task"], key)
        if pair in done:  # the same key twice in one call: the second is a duplicate
            out.append(dataclasses.replace(done[pair], duplicate=True))
        elif pair in new_keyed:
            done[pair] = _fresh(new_keyed[pair], entry)
            out.append(done[pair])
        else:
            done[pair] = old_keyed[pair]
            out.append(done[pair])
    return out


def _missing(entries: Sequence[dict[str, Any]], inserted: list[Any]) -> dict[str, list[str]]:
    new = {(r.task, r.idempotency_key) for r in inserted}
    missing: dict[str, list[str]] = {}
    for entry in entries:
        key = entry.get("idempotency_key")
        if key is not None and (entry["task"], key) not in new:
            missing.setdefault(entry["task"], []).append(key)
    return missing


def _bound(session: Session) -> Any:
    """What the session runs its statements on (an Engine or a Connection), if it has one
    bind for all (else None): its dialect, without a round trip."""
    tx = session.info.get(_TX)
    if tx is not None:  # a task's session, before or after its first statement
        return tx.pool.engine.sync_engine
    try:
        return session.get_bind()
    except sa.exc.UnboundExecutionError:
        return None


def _enqueue_plan(dialect: Dialect, entries: Sequence[dict[str, Any]]) -> Plan[list[TaskRecord]]:
    """Insert tasks in the open transaction (one statement per chunk), then read the existing
    rows of keys that inserted nothing; the records in the order of `entries`."""
    try:
        inserted: list[Any] = []
        for chunk in _chunks(_params(dialect, entries)):
            bulk = dialect.bulk_enqueue(chunk) if len(chunk) > 1 else None
            step: Step = bulk or (dialect.enqueue_statement, chunk[0] if len(chunk) == 1 else chunk)
            inserted += (yield step).all()
        existing: list[Any] = []
        for task, keys in _missing(entries, inserted).items():
            existing += (yield task_queue_sql.by_keys(task, keys), None).all()
    except DBAPIError as exc:
        raise_translated(dialect, exc)
    return _merge(entries, inserted, existing)


async def enqueue(
    session: AsyncSession | Any, entries: Sequence[dict[str, Any]]
) -> list[TaskRecord]:
    """Insert tasks in the caller's open transaction; existing idempotency keys insert nothing.

    Each entry has task, queue, args and optionally idempotency_key, run_at, delay (seconds),
    priority, the limits and trace (the enqueueing code's trace context, as JSON text).
    `session` is an AsyncSession or a bare driver connection (asyncpg). On an AsyncSession
    over asyncpg the INSERT goes straight to the session's driver connection, in its
    transaction (see `postgres.session_driver`).
    """
    driver = driver_dialect(session)
    if driver is not None:
        return await _enqueue_on_driver(driver, session, entries)
    bound = _bound(session.sync_session)
    bind = bound or await session.connection()
    dialect = dialect_for(bind.dialect.name)
    if bound is not None:  # one bind for every table: the session's connection is oncely's
        on_driver = await dialect.session_driver(session, bound)
        if on_driver is not None:  # the prepared INSERT, in the session's transaction
            return await _enqueue_on_driver(dialect, on_driver, entries)
    return await run_async(session, _enqueue_plan(dialect, entries))


async def _enqueue_on_driver(
    dialect: Dialect, conn: Any, entries: Sequence[dict[str, Any]]
) -> list[TaskRecord]:
    inserted: list[Any] = []
    for chunk in _chunks(_params(dialect, entries)):
        inserted += await dialect.enqueue_on_driver(conn, chunk)
    existing: list[Any] = []
    for task, keys in _missing(entries, inserted).items():
        existing += await dialect.tasks_by_keys_on_driver(conn, task, keys)
    return _merge(entries, inserted, existing)


def enqueue_sync(session: Session, entries: Sequence[dict[str, Any]]) -> list[TaskRecord]:
    """`enqueue` for a synchronous Session (Django, Flask, scripts)."""
    dialect = dialect_for((_bound(session) or session.connection()).dialect.name)
    return run(session, _enqueue_plan(dialect, entries))


_TX = "oncely.task_transaction"

_EARLIEST = datetime(1, 1, 1, tzinfo=timezone.utc)
"""Where a prune's first batch starts: before any time a row can hold."""


class TaskSession(AttemptSession):
    """A task's session: its commit, rollback and close belong to oncely, and its first
    statement takes a connection of the worker's pool (see TaskTransaction)."""

    def get_bind(self, *args: Any, **kwargs: Any) -> Any:
        tx = self.info.get(_TX)
        if tx is None:
            return super().get_bind(*args, **kwargs)  # refuses once the attempt has ended
        return tx.connection()


@event.listens_for(TaskSession, "after_begin")
def _on_begin(session: Session, _transaction: Any, connection: Connection) -> None:
    tx = session.info.get(_TX)
    if tx is not None:
        tx.began(connection)


def _by_token(leased: Sequence[Leased]) -> dict[str, list[int]]:
    by_token: dict[str, list[int]] = {}
    for item in leased:
        by_token.setdefault(item.token, []).append(item.id)
    return by_token


@dataclass(frozen=True)
class Settle:
    """What a worker writes for a task whose attempt ended without a commit of its own:
    `state` succeeded (its ack: it made no statement), or its retry (available, in `wait`
    seconds) or end (discarded, dead) with `error`, after its work rolled back."""

    item: Leased
    state: TaskState
    wait: float | None = None
    error: str | None = None
    result: str | None = None
    """A success's return value, as JSON text (`tasks.encode_result`), or None."""
    kept: bool = True
    """Whether a failure's `error` joins the task's attempt history (oncely_task_errors,
    schema 11) as well as its row: False for an operator's cancel, which is no failure."""


def _error_row(s: Settle, by: str | None) -> dict[str, Any]:
    """A failed attempt's history row, as record_errors' parameters."""
    return {"p_task": s.item.id, "p_attempt": s.item.attempt, "p_error": s.error, "p_by": by}


class _Handle(Protocol):
    session: AsyncSession
    touched: bool


async def ready_to_ack(handle: _Handle) -> bool:
    """Flush what a task left pending in its session (its own work: an error here is the
    task's); whether it made a statement, and if so its session is taken over for the ack
    (a task that made none has nothing to ack in a transaction: its ack is a `Settle`)."""
    session, sync = handle.session, handle.session.sync_session
    if sync.new or sync.dirty or sync.deleted:
        await session.flush()
    if not handle.touched:
        return False
    take_over(sync)
    return True


class TaskTransaction:
    """One task's own transaction, holding that task's statements and its ack, nothing else.

    The task's first statement (a query, a flush, or the task asking for the connection)
    takes a connection of the worker's pool and begins the transaction; `commit` acks the
    task in it, a compare-and-set on (id, lease token), and commits work and ack together;
    `close` rolls back whatever did not commit and gives the connection back. A task that
    makes no statement takes no connection at all.
    """

    def __init__(self, tasks: TaskQueue, pool: TaskPool, item: Leased, *, eager: bool) -> None:
        self.tasks = tasks
        self.pool = pool
        self.item = item
        self.dialect = tasks.dialect
        self.touched = False
        """The task made a statement: its transaction is open (until commit or close)."""
        self._options = self.dialect.task_options(eager=eager)
        self._conn: AsyncConnection | None = None
        self._driver: Any = None
        self._begun = False
        """The connection came from the pool in a transaction begun for this task."""
        self._next_begun = False
        """This task's COMMIT began the next task's transaction: its connection goes to the
        task waiting for it (TaskPool.hand_off)."""
        self._lending: asyncio.Lock | None = None
        # Bound to the pool's engine for what a task reads of it (`db.bind.dialect`); its
        # statements take the connection `connection()` lends (TaskSession.get_bind).
        self.opened = False
        """SQLAlchemy's session began: it has a transaction of its own to end at `close`."""
        self.session = AsyncSession(
            bind=pool.engine, sync_session_class=TaskSession, expire_on_commit=False
        )
        self.session.sync_session.info[_TX] = self
        set_driver_lender(self.session.sync_session, self.lend)

    async def lend(self) -> Any:
        """The driver's connection in the task's transaction, for a task that asks for it
        (`asyncpg_connection`) before its session made a statement: the connection taken and
        the transaction begun as at the session's first statement, without the session
        beginning; None where SQLAlchemy's BEGIN is the task's (the session begins then).
        Calls made at once (a task asking twice concurrently) share the one connection."""
        if self._driver is None:
            if self._lending is None:
                self._lending = asyncio.Lock()
            async with self._lending:
                if self._driver is None:
                    sync = await self._taken()
                    self._driver = await self.dialect.begin_task_lent(sync, begun=self._begun)
                    self.touched = self._driver is not None
        return self._driver

    async def _taken(self) -> Connection:
        if self._conn is None:
            self._conn, self._begun = await self.pool.take()
        return self._connected()

    def _connected(self) -> Connection:
        assert self._conn is not None
        sync = self._conn.sync_connection
        assert sync is not None  # an AsyncConnection that is connected
        if self._options:
            sync.execution_options(**self._options)
        return sync

    def connection(self) -> Connection:
        """The task's connection, taken from the pool at the first call (in the session's
        greenlet, where the pool can be awaited)."""
        if self._conn is None:
            self._conn, self._begun = await_only(self.pool.take())
        return self._connected()

    def began(self, connection: Connection) -> None:
        """The session began on `connection` (its first statement is next): the task's
        transaction begins, unless the task's `lend` began it already."""
        self.touched = self.opened = True
        if self._driver is None:
            self._driver = self.dialect.begin_task(connection, begun=self._begun)

    async def commit(self, result: str | None = None) -> bool | None:
        """Flush what the task left pending, then ack it and commit its work with the ack
        (and its `result`, JSON text, if any): True; False if its lease was lost (nothing of
        it committed); None if the task made no statement (nothing to commit: its ack is a
        `Settle` for the worker to write)."""
        if not await ready_to_ack(self):
            return None
        session, item = self.session, self.item
        with self.tasks.db.translate():
            if self._driver is not None and result is None:
                hooks.before_commit(item.task, str(item.id))
                # A task waits for a connection: its transaction begins with this COMMIT.
                begin_next = self.pool.waiting
                acked = await self.dialect.ack_and_commit(
                    self._driver,
                    item.id,
                    item.token,
                    begin_next=begin_next,
                    function=self.tasks.db.has_ack_function,
                )
                self._next_begun = acked and begin_next and self._driver.is_in_transaction()
                return acked
            if (await session.execute(*self.tasks.ack_one(item, result))).first() is None:
                await session.rollback()
                return False
            hooks.before_commit(item.task, str(item.id))
            if self._driver is not None:
                await self._driver.execute("COMMIT")  # the transaction begun on the driver
            else:
                await session.commit()
            return True

    async def close(self) -> None:
        """Roll back what did not commit and give the connection back to the pool."""
        sync = self.session.sync_session
        take_over(sync)
        handed = False
        try:
            if self._next_begun and self._conn is not None:
                # Closed first (it sends nothing: SQLAlchemy's adapter holds no transaction of
                # its own in autocommit), then the connection goes to the waiting task.
                if self.opened:
                    with contextlib.suppress(Exception):
                        await self.session.close()
                handed = self.pool.hand_off(self._conn)
            if not handed:
                if self._driver is not None:
                    with contextlib.suppress(Exception):
                        await self.dialect.rollback_task(self._driver)
                # A task that made no statement holds no transaction nor connection: unless
                # it left objects in the session, there is nothing to close.
                if self.opened or sync.new or sync.identity_map:
                    with contextlib.suppress(Exception):
                        await self.session.close()
        finally:
            sync.info.pop(_TX, None)
            set_driver_lender(sync, None)
            end(sync)
            conn, self._conn = self._conn, None
            if conn is not None and not handed:
                await self.pool.give(conn)


class Fence:
    """What stops a sync task's thread from committing once its attempt was given up (a
    timeout, a cancel, a shutdown): the thread commits only while holding the lock with the
    fence open, so after `close()` returns, that attempt never commits."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True


class AttemptGivenUp(Exception):
    """A sync task returned after its attempt was given up: rolled back, nothing committed."""


def _groups(rows: list[Any], limit: str, key: str) -> dict[tuple[str, str], list[Any]]:
    """The leased rows with a `limit`, by group (task, key), each group in lease order."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for r in sorted(rows, key=lambda r: (-r.priority, r.run_at, r.id)):
        if getattr(r, limit) is not None:
            groups.setdefault((r.task, getattr(r, key)), []).append(r)
    return groups


def _beyond(
    groups: dict[tuple[str, str], list[Any]],
    counts: dict[tuple[str, str], int],
    limit: str,
    *,
    own_counted: bool,
) -> set[int]:
    """The last rows of each group past its limit, given the group's count (which includes
    this lease's own rows if `own_counted`)."""
    over: set[int] = set()
    for group, own in groups.items():
        total = counts.get(group, 0) + (0 if own_counted else len(own))
        excess = total - min(getattr(r, limit) for r in own)
        if excess > 0:
            over.update(r.id for r in own[-excess:])
    return over


class TaskQueue:
    """Leases, batches and the operator's views of the oncely_tasks table."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.dialect = db.dialect
        self.ack_statement = task_queue_sql.ack(self.dialect.now_sql())
        self.ack_result_statement = task_queue_sql.ack_with_result(self.dialect.now_sql())
        self.begin_statement = task_queue_sql.begin_attempt(self.dialect.now_sql())
        self._fetch: dict[tuple[tuple[str, ...] | None, float, tuple[str, ...] | None], Any] = {}

    def _fetch_statement(
        self, queues: Sequence[str] | None, lease: float, names: Sequence[str] | None
    ) -> Any:
        key = (
            tuple(queues) if queues is not None else None,
            lease,
            tuple(sorted(names)) if names is not None else None,
        )
        stmt = self._fetch.get(key)
        if stmt is None:
            # With a database clock the lease's end is an expression of it; without one it is
            # bound at each call (p_until).
            until = (
                self.dialect.after(lease)
                if self.dialect.database_clock
                else sa.bindparam("p_until", type_=tables.tasks.c.lease_expires_at.type)
            )
            stmt = self._fetch[key] = task_queue_sql.fetch(
                queues,
                self.dialect.now_sql(),
                until,
                key[2],
                self.dialect.limit_lock,
                self.dialect.among,
                self.dialect.scan_now(),
            )
        return stmt

    async def lease(
        self,
        conn: AsyncConnection,
        queues: Sequence[str] | None,
        limit: int,
        token: str,
        by: str,
        lease: float,
        names: Sequence[str] | None = None,
        start: int | None = None,
    ) -> list[Leased]:
        """Lease up to `limit` due tasks in `conn`'s open transaction, highest priority first,
        then oldest; with `names`, only tasks of those names. Tasks over a concurrency or
        rate limit are left waiting (their attempts not counted). The attempts of the first
        `start` (default: all) count now; the others' when their bodies start."""
        params: dict[str, Any] = {"p_limit": limit, "p_token": token, "p_by": by}
        params["p_start"] = limit if start is None else start
        params["p_scan"] = 2 * limit + task_queue_sql.SCAN
        params.update(self.dialect.now_params())
        if not self.dialect.database_clock:
            params["p_until"] = self.dialect.after(lease)
        stmt = self._fetch_statement(queues, lease, names)
        # On a worker's control connection (Postgres on asyncpg) the lease goes on the driver:
        # SQLAlchemy's statement machinery costs more CPU than the lease's round trip, and it
        # stands between a notification and the task's start.
        rows = await self.dialect.rows_on_driver(conn, stmt, params)
        if rows is None:
            rows = list(await conn.execute(stmt, params))
        if any(r.concurrency is not None or r.rate is not None for r in rows):
            rows = await self._limited(conn, rows, token)
        rows.sort(key=lambda r: (-r.priority, r.run_at, r.id))
        return [
            Leased(
                r.id,
                r.task,
                r.args,
                r.attempt,
                r.queue,
                token,
                r.trace_context,
                r.started_at is not None,
            )
            for r in rows
        ]

    async def _limited(self, conn: AsyncConnection, rows: list[Any], token: str) -> list[Any]:
        """After a lease that took limited tasks: on a database where another leaser's commit
        may have escaped the lease's snapshot, count again (now that this transaction holds
        the groups' locks) and hand back what is over; then record the rate starts."""
        if self.dialect.concurrent_leases:
            over = await self._over(conn, rows)
            for counted in (True, False):
                ids = [r.id for r in rows if r.id in over and (r.started_at is not None) is counted]
                if ids:
                    await conn.execute(task_queue_sql.unlease(ids, token, counted=counted))
            rows = [r for r in rows if r.id not in over]
        rated = [r for r in rows if r.rate is not None]
        if rated:
            groups = sorted({(r.task, r.rate_key) for r in rated})
            await conn.execute(
                task_queue_sql.forget_starts(groups, self.dialect.now_sql()),
                self.dialect.now_params(),
            )
            starts = [
                {
                    "p_task": r.task,
                    "p_key": r.rate_key,
                    "p_at": r.leased_at,
                    "p_until": r.leased_at + timedelta(seconds=r.rate_period),
                }
                for r in rated
            ]
            await conn.execute(task_queue_sql.record_starts(), starts)
        return rows

    async def _over(self, conn: AsyncConnection, rows: list[Any]) -> set[int]:
        """The ids of leased tasks beyond their groups' room, counted in a fresh snapshot."""
        over: set[int] = set()
        concurrent = _groups(rows, "concurrency", "concurrency_key")
        if concurrent:
            stmt = task_queue_sql.live_leases(sorted(concurrent), self.dialect.now())
            counts = {(t, k): n for t, k, n in await conn.execute(stmt)}
            over |= _beyond(concurrent, counts, "concurrency", own_counted=True)
        rated = _groups(rows, "rate", "rate_key")
        if rated:
            earliest = min(r.leased_at for r in rows if r.rate is not None)
            stmt = task_queue_sql.recent_starts(sorted(rated), earliest)
            counts = {(t, k): n for t, k, n in await conn.execute(stmt)}
            over |= _beyond(rated, counts, "rate", own_counted=False)
        return over

    async def ack(
        self,
        conn: AsyncConnection,
        leased: Sequence[Leased],
        results: Mapping[int, str] | None = None,
    ) -> set[int]:
        """In `conn`'s open transaction (the tasks' own work's): mark these tasks succeeded
        iff their leases are still ours; the ids that were. Tasks without a result take one
        statement per lease token; a task with one (`results`, by id: JSON text, bound as a
        parameter) one statement of its own, which stores it with the success."""
        results = results or {}
        held: set[int] = set()
        plain = [item for item in leased if item.id not in results]
        for token, ids in _by_token(plain).items():
            params = {"p_ids": ids, "p_token": token, **self.dialect.now_params()}
            rows = await conn.execute(self.ack_statement, params)
            held.update(r.id for r in rows)
        for item in leased:
            if item.id in results:
                params = {"p_id": item.id, "p_token": item.token, "p_result": results[item.id]}
                params.update(self.dialect.now_params())
                rows = await conn.execute(self.ack_result_statement, params)
                held.update(r.id for r in rows)
        return held

    async def fetch(
        self,
        conn: AsyncConnection,
        queues: Sequence[str] | None,
        limit: int,
        token: str,
        by: str,
        lease: float,
        names: Sequence[str] | None = None,
        start: int | None = None,
    ) -> list[Leased]:
        """Lease up to `limit` due tasks in a transaction of their own (the attempts of the
        first `start`, default all, count now)."""
        with self.db.translate():
            async with conn.begin():
                return await self.lease(conn, queues, limit, token, by, lease, names, start)

    async def begin_attempts(self, leased: Sequence[Leased], engine: AsyncEngine) -> dict[int, int]:
        """Count the attempts of leased-ahead tasks whose bodies start now: one task with a
        statement built once (on asyncpg, on the driver), several with one statement per
        lease token; {id: attempt} of those whose lease is still this worker's."""
        counted: dict[int, int] = {}
        with self.db.translate():
            async with engine.connect() as conn:
                if len(leased) == 1:
                    (item,) = leased
                    stmt = self.begin_statement
                    params = {"p_id": item.id, "p_token": item.token, **self.dialect.now_params()}
                    rows = await self.dialect.rows_on_driver(conn, stmt, params)
                    if rows is None:
                        async with conn.begin():
                            rows = list(await conn.execute(stmt, params))
                    return {r.id: r.attempt for r in rows}
                async with conn.begin():
                    for token, ids in _by_token(leased).items():
                        stmt = task_queue_sql.begin_attempts(ids, token, self.dialect.now())
                        counted.update((r.id, r.attempt) for r in await conn.execute(stmt))
        return counted

    async def hand_back_unrunnable(
        self, leased: Sequence[Leased], wait: float, reason: str, engine: AsyncEngine
    ) -> set[int]:
        """Hand back tasks this worker cannot run, uncounted, due again in `wait` seconds
        with `reason` as their error; the ids handed back."""
        done: set[int] = set()
        with self.db.translate():
            async with engine.begin() as conn:
                for counted in (True, False):
                    group = [item for item in leased if item.counted is counted]
                    for token, ids in _by_token(group).items():
                        stmt = task_queue_sql.hand_back_unrunnable(
                            ids, token, self.dialect.after(wait), reason, counted=counted
                        )
                        done.update(r.id for r in await conn.execute(stmt))
        return done

    async def next_due(
        self,
        conn: AsyncConnection,
        queues: Sequence[str] | None,
        names: Sequence[str] | None,
        *,
        held: bool,
        since: float = 0.0,
    ) -> tuple[float | None, bool]:
        """Seconds until the next available task of these queues and names comes due among
        those due later than `since` seconds ago (None: none; zero or less: one came due in
        those seconds, after the last lease looked), and (with `held`) whether a task that a
        limit holds back is due already; by database time, in one statement."""
        dialect = self.dialect
        stmt = task_queue_sql.next_due(
            dialect.scan_now(), dialect.scan_ago(since), queues, names, held=held
        )
        with self.db.translate():
            row = (await conn.execute(stmt, self.dialect.now_params())).one()
        later = None if row.next_at is None else (row.next_at - row.now).total_seconds()
        return later, bool(row.held) if held else False

    def ack_one(self, item: Leased, result: str | None) -> tuple[Any, dict[str, Any]]:
        """The ack of one task (with its result, if any) as (statement, parameters)."""
        if result is None:
            return self.ack_statement, {
                "p_ids": [item.id],
                "p_token": item.token,
                **self.dialect.now_params(),
            }
        params = {"p_id": item.id, "p_token": item.token, "p_result": result}
        return self.ack_result_statement, {**params, **self.dialect.now_params()}

    def sync_session(self, *, eager: bool = False) -> tuple[Session, list[bool]]:
        """A session on the synchronous engine for one plain `def` task's transaction, and
        a list that gets an entry when the session begins one (the task made a statement)."""
        sessions = self.db.sync_sessions
        options = self.dialect.task_options(eager=eager)
        touched: list[bool] = []
        session = sessions()
        if options:
            session.bind = session.get_bind().execution_options(**options)
        event.listen(session, "after_begin", lambda *_: touched.append(True))
        return session, touched

    def commit_sync(
        self, session: Session, touched: list[bool], item: Leased, fence: Fence, result: str | None
    ) -> bool | None:
        """Commit a plain `def` task's work with its ack (the task's return value as JSON
        text, `result`), unless its fence closed: True if they committed, False if its lease
        was lost, None if it made no statement (its ack is then the worker's to write)."""
        if session.new or session.dirty or session.deleted:
            session.flush()
        what = violation(session)
        if what is not None:
            raise JobTransactionError(f"the task called {what}() on oncely's session")
        if not touched:
            return None
        take_over(session)
        with self.db.translate(), fence.lock:
            if fence.closed:
                session.rollback()
                raise AttemptGivenUp("the attempt was given up before it could commit")
            if session.execute(*self.ack_one(item, result)).first() is None:
                session.rollback()
                return False
            hooks.before_commit(item.task, str(item.id))
            session.commit()
            return True

    def close_sync(self, session: Session) -> None:
        """Close a plain `def` task's session (its transaction rolled back if still open)."""
        take_over(session)
        with contextlib.suppress(Exception):
            session.close()
        end(session)

    def transaction(self, pool: TaskPool, item: Leased, *, eager: bool = False) -> TaskTransaction:
        """A leased task's own transaction, on a worker's pool (see TaskTransaction)."""
        return TaskTransaction(self, pool, item, eager=eager)

    async def settle(
        self, settles: Sequence[Settle], engine: AsyncEngine | None = None
    ) -> set[int]:
        """Write many tasks' acks, retries and ends, each iff the task's lease is still ours
        (on a worker's control connection, each statement is its own transaction and does
        not wait for the disk: none of these tasks changed the database); the ids written (a
        missing id lost its lease)."""
        acks = [s.item for s in settles if s.state is TaskState.SUCCEEDED]
        results = {s.item.id: s.result for s in settles if s.result is not None}
        for item in acks:  # the seam between work and commit: here, before the ack's statement
            hooks.before_commit(item.task, str(item.id))  # (which commits itself in autocommit)
        with self.db.translate():
            async with (engine or self.db.engine).begin() as conn:
                done = await self.ack(conn, acks, results)
                done |= await self._record_outcomes(conn, settles)
        return done

    async def _record_outcomes(self, conn: AsyncConnection, settles: Sequence[Settle]) -> set[int]:
        """The retries and ends among `settles`, each iff its lease is still ours, with each
        failure's history row (schema 11) written with it: in the same statement where the
        database can (a worker's settle connection commits each statement on its own), else
        after them all in one executemany, in the same transaction; the ids written."""
        done: set[int] = set()
        kept: list[dict[str, Any]] = []
        history = self.db.has_task_errors
        now = self.dialect.now()
        for s in settles:
            if s.state is TaskState.SUCCEEDED:
                continue
            run_at = self.dialect.after(s.wait) if s.wait is not None else None
            stmt = task_queue_sql.record_outcome(
                s.item.id, s.item.token, s.state.value, run_at, s.error, now
            )
            if history and s.kept and self.dialect.writes_in_with:
                stmt = task_queue_sql.record_outcome_and_error(stmt, s.error, now)
                if (await conn.execute(stmt)).first() is not None:
                    done.add(s.item.id)
                continue
            row = (await conn.execute(stmt)).first()
            if row is not None:
                done.add(s.item.id)
                if history and s.kept:
                    kept.append(_error_row(s, row.locked_by))
        if kept:
            await conn.execute(task_queue_sql.record_errors(now), kept)
        return done

    async def heartbeat(
        self, leased: Sequence[Leased], lease: float, engine: AsyncEngine | None = None
    ) -> set[int]:
        """Extend the leases of tasks this worker holds; the ids whose lease is still ours."""
        if not leased:
            return set()
        stmt = task_queue_sql.heartbeat(
            [t.id for t in leased],
            sorted({t.token for t in leased}),
            self.dialect.after(lease),
            self.dialect.now(),
        )
        with self.db.translate():
            async with (engine or self.db.engine).begin() as conn:
                return {r.id for r in await conn.execute(stmt)}

    async def hand_back_unstarted(
        self,
        leased: Sequence[Leased],
        *,
        started: bool = False,
        engine: AsyncEngine | None = None,
    ) -> None:
        """Hand back leased tasks that never started (a stopping worker, a concurrency limit
        full): available at once to any worker, the attempt not counted (`started=True`, tasks
        that did start, keeps it counted)."""
        with self.db.translate():
            async with (engine or self.db.engine).begin() as conn:
                for counted in (True, False):
                    group = [item for item in leased if item.counted is counted]
                    keep = started or not counted
                    for token, ids in _by_token(group).items():
                        await conn.execute(
                            task_queue_sql.hand_back_unstarted(
                                ids, token, self.dialect.now(), started=keep
                            )
                        )
                await self.dialect.notify_tasks(conn)

    async def hand_back_cancelled(
        self, leased: Sequence[Leased], engine: AsyncEngine | None = None
    ) -> list[Any]:
        """Hand back tasks whose attempts a shutdown cancelled: available at once, the attempt
        not counted, recorded as cancelled; (id, task, attempt) of each handed back."""
        handed: list[Any] = []
        with self.db.translate():
            async with (engine or self.db.engine).begin() as conn:
                for counted in (True, False):
                    group = [item for item in leased if item.counted is counted]
                    for token, ids in _by_token(group).items():
                        stmt = task_queue_sql.hand_back_cancelled(
                            ids, token, self.dialect.now(), counted=counted
                        )
                        handed += list(await conn.execute(stmt))
                if handed:
                    await self.dialect.notify_tasks(conn)
        return handed

    async def rescue(self, limit: int = 1000, engine: AsyncEngine | None = None) -> list[Any]:
        """Make tasks with an expired lease available again; (id, task, attempt, locked_by)."""
        with self.db.translate():
            async with (engine or self.db.engine).begin() as conn:
                rows = list(await conn.execute(task_queue_sql.rescue(self.dialect.now(), limit)))
                if rows:
                    await self.dialect.notify_tasks(conn)
                return rows

    # -- live workers -------------------------------------------------------------------

    async def announce(
        self, worker_id: str, names: Sequence[str], engine: AsyncEngine, *, first: bool
    ) -> None:
        """Record a live worker and the task names it leases (`first`: it just started),
        or its periodic sign of life. A database without the table (schema 3) is left as it
        is: the worker runs, unlisted."""
        now = self.dialect.now()
        stmt = (
            task_queue_sql.worker_started(worker_id, json.dumps(sorted(names)), now)
            if first
            else task_queue_sql.worker_seen(worker_id, now)
        )
        await self._quietly(engine, stmt)

    async def turn(self, worker_id: str, within: float, engine: AsyncEngine) -> tuple[int, int]:
        """(this worker's place among the workers seen in the last `within` seconds, how
        many they are), by id; (0, 1) if it is not among them (not announced yet, or a
        database without the table)."""
        try:
            with self.db.translate():
                async with engine.connect() as conn:
                    stmt = task_queue_sql.live_worker_ids(self.dialect.after(-within))
                    ids = list((await conn.execute(stmt)).scalars())
        except OncelyError as exc:
            if not self.dialect.is_missing_table(exc.__cause__ or exc):
                raise
            return 0, 1
        return (ids.index(worker_id), len(ids)) if worker_id in ids else (0, 1)

    async def retire(self, worker_id: str, engine: AsyncEngine) -> None:
        """A worker stops: its row goes."""
        await self._quietly(engine, task_queue_sql.worker_gone(worker_id))

    async def _quietly(self, engine: AsyncEngine, stmt: Any) -> None:
        try:
            with self.db.translate():
                async with engine.begin() as conn:
                    await conn.execute(stmt)
        except OncelyError as exc:
            if not self.dialect.is_missing_table(exc.__cause__ or exc):
                raise

    async def unrunnable(self, within: float) -> dict[str, int] | None:
        """The names of available tasks that no worker seen in the last `within` seconds
        leases, with how many of each wait, while such workers run; None when none does (or
        the database has no workers table: schema 3)."""
        try:
            rows = await self.db.read(task_queue_sql.live_workers(self.dialect.after(-within)))
        except OncelyError as exc:
            if self.dialect.is_missing_table(exc.__cause__ or exc):
                return None
            raise
        if not rows:
            return None
        live: set[str] = set()
        for (names,) in rows:
            live.update(json.loads(names))
        waiting = await self.db.read(task_queue_sql.waiting_by_task())
        return {name: int(n) for name, n in waiting if name not in live}

    async def without_worker(self, within: float, late: float) -> tuple[int, datetime] | None:
        """While no worker was seen in the last `within` seconds: how many available tasks
        have been due for more than `late` seconds, and the oldest one's due time; None if a
        worker is live, none is that late, or the database has no workers table."""
        try:
            live = await self.db.read(task_queue_sql.live_workers(self.dialect.after(-within)))
        except OncelyError as exc:
            if self.dialect.is_missing_table(exc.__cause__ or exc):
                return None
            raise
        if live:
            return None
        rows = await self.db.read(task_queue_sql.due_waiting(self.dialect.after(-late)))
        count, oldest = rows[0]
        return (int(count), oldest) if count else None

    # -- the operator's views -----------------------------------------------------------

    async def listing(
        self, state: TaskState | None, task: str | None, limit: int
    ) -> list[TaskRecord]:
        """Tasks newest first."""
        stmt = task_queue_sql.listing(state.value if state else None, task, limit)
        return [record(r) for r in await self.db.read(stmt)]

    async def get(self, task_id: int) -> TaskRecord | None:
        """One task, or None."""
        rows = await self.db.read(task_queue_sql.get(task_id))
        return record(rows[0]) if rows else None

    async def _change(self, stmt: Any) -> TaskRecord | None:
        await self.db.ensure_schema()
        with self.db.translate():
            async with self.db.engine.begin() as conn:
                row = (await conn.execute(stmt)).first()
        return record(row) if row is not None else None

    async def retry_now(self, task_id: int) -> TaskRecord | None:
        """Make a dead, discarded or waiting task run now; None if it is in no such state."""
        return await self._change(task_queue_sql.retry_now(task_id, self.dialect.now()))

    async def discard(self, task_id: int) -> TaskRecord | None:
        """Discard a task that has not succeeded; None if it is in no such state."""
        return await self._change(task_queue_sql.discard(task_id, self.dialect.now()))

    async def prune(
        self, before: datetime, batch: int = task_queue_sql.PRUNE_BATCH
    ) -> tuple[int, int]:
        """Delete tasks finished before `before` and claims made before it; (tasks, claims).

        In batches of at most `batch` rows, oldest first, each in a transaction of its own:
        workers and writers never wait behind a prune for longer than one batch, and an
        interrupted prune has deleted whole batches only (running it again goes on from there).
        """
        await self.db.ensure_schema()
        pruned_tasks = 0
        for state in task_queue_sql.FINISHED:
            pruned_tasks += await self._delete_batches(
                task_queue_sql.prune_tasks(state, before, batch), with_errors=True
            )
        pruned_claims = await self._delete_batches(task_queue_sql.prune_claims(before, batch))
        return pruned_tasks, pruned_claims

    async def _delete_batches(self, stmt: Any, *, with_errors: bool = False) -> int:
        """Run a batch DELETE (RETURNING the time of each row deleted, then, `with_errors`,
        its task id), each time in its own transaction and from the newest time the last one
        deleted, until one deletes nothing; how many rows it deleted in all. `with_errors`:
        the deleted tasks' attempt errors go in the same transaction (schema 11)."""
        total, since = 0, _EARLIEST
        while True:
            with self.db.translate():
                async with self.db.engine.begin() as conn:
                    rows = (await conn.execute(stmt, {"p_since": since})).all()
                    if rows and with_errors and self.db.has_task_errors:
                        await conn.execute(task_queue_sql.forget_errors([r[1] for r in rows]))
            times = [r[0] for r in rows]
            if not times:
                return total
            total += len(times)
            since = max(times)

    async def count(self) -> dict[str, int]:
        """How many tasks are in each state."""
        return {r[0]: int(r[1]) for r in await self.db.read(task_queue_sql.counts())}

    async def count_by_task(self) -> dict[str, dict[str, int]]:
        """For each task name that has rows: how many are in each state."""
        found: dict[str, dict[str, int]] = {}
        for name, state, n in await self.db.read(task_queue_sql.counts_by_task()):
            found.setdefault(name, {})[state] = int(n)
        return found
