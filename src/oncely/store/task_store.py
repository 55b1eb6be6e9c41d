"""The task queue's side of the store: enqueue in the caller's transaction, leases, batches.

A worker runs a batch of leased tasks in one transaction, each task in a savepoint of its own
(opened just before its first statement: a task that touches no table costs no round trip),
the tasks sharing one session that is emptied between them. A task that
raises rolls back to its savepoint and its retry (or end) is recorded in the same transaction.
At the end, one compare-and-set on (id, lease_token) marks every task that returned succeeded;
the commit lands each task's work together with its ack: one effect per task. The worker rolls
the whole transaction back if a task that wrote turns out to have lost its lease.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from .. import clock, hooks
from ..model import TaskRecord, TaskState
from . import tables, tasks_sql
from .claims import raise_translated
from .dialect import Dialect
from .dialects import dialect_for, driver_dialect
from .plan import Plan, Step, run, run_async
from .session import AttemptSession, hand_back


class Ledger(Protocol):
    """What the task queue's statements need of the store they run on (the Store)."""

    dialect: Dialect
    engine: AsyncEngine

    def translate(self) -> contextlib.AbstractContextManager[None]: ...

    async def ensure_schema(self) -> None: ...

    async def _read(self, stmt: Any) -> list[Any]: ...


@dataclass(frozen=True)
class Leased:
    """A task this worker holds a lease on: one attempt to run."""

    id: int
    task: str
    args: dict[str, Any]
    attempt: int
    queue: str
    token: str


def record(row: Any, *, duplicate: bool = False) -> TaskRecord:
    """A task row as a TaskRecord."""
    return TaskRecord(
        id=row.id,
        task=row.task,
        queue=row.queue,
        args=row.args,
        state=TaskState(row.state),
        attempt=row.attempt,
        run_at=row.run_at,
        created_at=row.created_at,
        idempotency_key=row.idempotency_key,
        started_at=row.started_at,
        finished_at=row.finished_at,
        locked_by=row.locked_by,
        lease_expires_at=row.lease_expires_at,
        error=row.error,
        duplicate=duplicate,
    )


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
            existing += (yield tasks_sql.by_keys(task, keys), None).all()
    except DBAPIError as exc:
        raise_translated(dialect, exc)
    return _merge(entries, inserted, existing)


async def enqueue(
    session: AsyncSession | Any, entries: Sequence[dict[str, Any]]
) -> list[TaskRecord]:
    """Insert tasks in the caller's open transaction; existing idempotency keys insert nothing.

    Each entry has task, queue, args and optionally idempotency_key, run_at, delay (seconds).
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


_EARLIEST = datetime(1, 1, 1, tzinfo=timezone.utc)
"""Where a prune's first batch starts: before any time a row can hold."""

SAVEPOINT = "oncely_task"
_BATCH = "oncely.batch"


class TaskSession(AttemptSession):
    """The tasks' session inside a batch: each task's first statement is seen by the batch
    (which opens the task's savepoint then, if it gives tasks one)."""

    def connection(
        self,
        bind_arguments: Any = None,
        execution_options: Any = None,
    ) -> Connection:
        # A task that takes the connection may run statements on the driver itself, which no
        # event sees (nor begins SQLAlchemy's transaction for): it gets its savepoint now,
        # which also begins the transaction, guarded batch or not.
        batch = self.info.get(_BATCH)
        if batch is not None:
            batch.first_statement(batch.conn.sync_connection, direct=True)
        return super().connection(bind_arguments, execution_options)


@event.listens_for(TaskSession, "after_begin")
def _on_begin(session: Session, _transaction: Any, connection: Connection) -> None:
    batch = session.info.get(_BATCH)
    if batch is not None:
        batch.first_statement(connection)


def _reusable(sync: Session) -> bool:
    """Whether a session a task returned from can serve the next task as it is."""
    if not sync.in_transaction():
        return True
    return sync.is_active and not sync.in_nested_transaction()


def _by_token(leased: Sequence[Leased]) -> dict[str, list[int]]:
    by_token: dict[str, list[int]] = {}
    for item in leased:
        by_token.setdefault(item.token, []).append(item.id)
    return by_token


class Batch:
    """One transaction running several leased tasks.

    The tasks share one session, which stays in the transaction from task to task (it is
    emptied after each, and replaced after a task that failed). The batch sees each task's
    first statement: whichever comes first of the session beginning, a statement on the
    connection, or the task asking for the connection; a task with none touched nothing.

    A `guarded` batch gives each task that writes a savepoint of its own, opened just before
    that first statement, so a failing task's work can be rolled back alone. The name is
    constant; savepoints are not released, so they nest, and ROLLBACK TO reaches the newest
    one: the failing task's own. An unguarded batch saves that round trip per task, except
    for a task that takes the connection (it may write on the driver, unseen); a task that
    wrote without a savepoint and failed cannot be undone alone (`undo` says so), and the
    worker rolls the whole transaction back instead.
    """

    def __init__(self, conn: AsyncConnection, tasks: TaskStore, *, guarded: bool = True) -> None:
        self.conn = conn
        self.tasks = tasks
        self.dialect = tasks.dialect
        self.guarded = guarded
        self.acked: list[Leased] = []
        """The tasks this batch acked: they succeed iff the batch commits."""
        self._session: AsyncSession | None = None
        self._pending = False
        """The running task has not run a statement yet."""
        self._touched = False
        """The running task ran a statement (it wrote, or tried to)."""
        self._saved = False
        """The running task opened a savepoint before its first statement."""
        self._failed = False
        """The running task failed: its session is replaced, not reused."""
        self.writers = 0
        """How many tasks of this batch ran a statement."""
        event.listen(conn.sync_connection, "before_cursor_execute", self._before_statement)

    def _before_statement(self, connection: Connection, *_args: Any) -> None:
        if self._pending:
            self.first_statement(connection)

    def first_statement(self, connection: Connection, *, direct: bool = False) -> None:
        """The running task is about to run its first statement (`direct`: on a connection it
        took): open its savepoint now if the batch is guarded or the task is direct."""
        if self._pending:
            self._pending = False  # first: the statement below passes _before_statement
            if self.guarded or direct:
                self.dialect.savepoint_sql(connection, f"SAVEPOINT {SAVEPOINT}")
                self._saved = True
            self._touched = True

    def session(self) -> AsyncSession:
        """The session for the next task; it never commits or rolls back the batch's
        transaction, and the batch sees its first statement (see `first_statement`)."""
        self._pending = True
        self._touched = self._saved = False
        if self._session is None:
            self._session = AsyncSession(
                bind=self.conn,
                join_transaction_mode="rollback_only",
                sync_session_class=TaskSession,
                expire_on_commit=False,
            )
            self._session.sync_session.info[_BATCH] = self
        return self._session

    async def finish(self, session: AsyncSession) -> None:
        """Flush what the task left pending (in its savepoint): its work is then all in SQL."""
        sync = session.sync_session
        if sync.identity_map or sync.new or sync.deleted:
            await session.flush()

    async def close(self, session: AsyncSession) -> None:
        """Done with a task: the session is emptied for the next one (replaced if the task
        failed or left it in a state of its own)."""
        self._pending = False
        if self._touched:
            self.writers += 1
        sync = session.sync_session
        if session is self._session and not self._failed and _reusable(sync):
            sync.expunge_all()
            if len(sync.info) > 1:
                sync.info.clear()
                sync.info[_BATCH] = self
            return
        self._failed = False
        await self._drop()

    async def _drop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.sync_session.info.pop(_BATCH, None)
            hand_back(session.sync_session)
            await session.close()

    async def end(self) -> None:
        """Close the tasks' session before the transaction ends."""
        event.remove(self.conn.sync_connection, "before_cursor_execute", self._before_statement)
        await self._drop()

    def touched(self, session: AsyncSession) -> bool:
        """Whether the running task ran a statement."""
        return self._touched

    async def undo(self, session: AsyncSession) -> bool:
        """Roll the task's work back to its savepoint (the batch's other work stays); its
        session is replaced. False if it cannot be undone alone: it wrote in an unguarded
        batch, and only rolling back the whole transaction removes its work."""
        self._pending, self._failed = False, True
        if not self._touched:
            return True
        if not self._saved:
            return False
        await self.conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
        return True

    async def ack(self, leased: Sequence[Leased]) -> set[int]:
        """Mark tasks that succeeded in this batch (whether or not they wrote) succeeded iff
        their leases are still ours, in one statement per lease token; the ids that were."""
        held: set[int] = set()
        for token, ids in _by_token(leased).items():
            params = {"p_ids": ids, "p_token": token, **self.dialect.now_params()}
            rows = await self.conn.execute(self.tasks.ack_statement, params)
            held.update(r.id for r in rows)
        self.acked += [item for item in leased if item.id in held]
        return held

    async def lease(
        self,
        queues: Sequence[str] | None,
        limit: int,
        token: str,
        by: str,
        lease: float,
        names: Sequence[str] | None = None,
    ) -> list[Leased]:
        """Lease the next tasks in this transaction: they commit with this batch's acks, so a
        busy worker pays one commit per batch, not two."""
        return await self.tasks.lease(self.conn, queues, limit, token, by, lease, names)

    async def outcome(
        self, item: Leased, state: TaskState, wait: float | None, error: str | None
    ) -> bool:
        """Record a task's retry (in `wait` seconds) or end, after its savepoint rolled back;
        False if the lease is no longer ours (nothing recorded)."""
        run_at = self.dialect.after(wait) if wait is not None else None
        stmt = tasks_sql.record_outcome(
            item.id, item.token, state.value, run_at, error, self.dialect.now()
        )
        return bool((await self.conn.execute(stmt)).rowcount)


class TaskStore:
    """Leases, batches and the operator's views of the oncely_tasks table."""

    def __init__(self, store: Ledger) -> None:
        self.store = store
        self.dialect = store.dialect
        self.ack_statement = tasks_sql.ack(self.dialect.now_sql())
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
            stmt = self._fetch[key] = tasks_sql.fetch(queues, self.dialect.now_sql(), until, key[2])
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
    ) -> list[Leased]:
        """Lease up to `limit` due tasks in `conn`'s open transaction, oldest id first; with
        `names`, only tasks of those names."""
        params: dict[str, Any] = {"p_limit": limit, "p_token": token, "p_by": by}
        params.update(self.dialect.now_params())
        if not self.dialect.database_clock:
            params["p_until"] = self.dialect.after(lease)
        rows = (await conn.execute(self._fetch_statement(queues, lease, names), params)).all()
        leased = [Leased(r.id, r.task, r.args, r.attempt, r.queue, token) for r in rows]
        leased.sort(key=lambda item: item.id)
        return leased

    async def fetch(
        self,
        conn: AsyncConnection,
        queues: Sequence[str] | None,
        limit: int,
        token: str,
        by: str,
        lease: float,
        names: Sequence[str] | None = None,
    ) -> list[Leased]:
        """Lease up to `limit` due tasks in a transaction of their own (the attempt counts)."""
        with self.store.translate():
            async with conn.begin():
                return await self.lease(conn, queues, limit, token, by, lease, names)

    @contextlib.asynccontextmanager
    async def batch(self, conn: AsyncConnection, *, guarded: bool = True) -> AsyncIterator[Batch]:
        """A transaction on `conn` that commits on a normal exit and rolls back otherwise
        (on any exception, BaseExceptions included: a test's simulated crash). `guarded`:
        whether each task that writes gets a savepoint (see Batch).

        Just before the commit, `hooks.before_commit(task, str(id))` is called for each acked
        task: the seam where the testing toolkit stops a worker between work and commit.
        """
        with self.store.translate():
            async with conn.begin():
                batch = Batch(conn, self, guarded=guarded)
                try:
                    yield batch
                finally:
                    await batch.end()
                await self.dialect.durable(conn)  # before the commit, not before the tasks
                for item in batch.acked:
                    hooks.before_commit(item.task, str(item.id))

    async def heartbeat(self, leased: Sequence[Leased], lease: float) -> set[int]:
        """Extend the leases of tasks this worker holds; the ids whose lease is still ours."""
        if not leased:
            return set()
        stmt = tasks_sql.heartbeat(
            [t.id for t in leased], sorted({t.token for t in leased}), self.dialect.after(lease)
        )
        with self.store.translate():
            async with self.store.engine.begin() as conn:
                return {r.id for r in await conn.execute(stmt)}

    async def release(self, leased: Sequence[Leased], *, started: bool = False) -> None:
        """Give back leased tasks at once; `started=False` does not count the attempt."""
        by_token: dict[str, list[int]] = {}
        for item in leased:
            by_token.setdefault(item.token, []).append(item.id)
        with self.store.translate():
            async with self.store.engine.begin() as conn:
                for token, ids in by_token.items():
                    await conn.execute(
                        tasks_sql.release(ids, token, self.dialect.now(), started=started)
                    )

    async def hand_back(self, leased: Sequence[Leased]) -> list[Any]:
        """Give back tasks whose attempts a shutdown cancelled: available at once, the attempt
        not counted, recorded as cancelled; (id, task, attempt) of each handed back."""
        handed: list[Any] = []
        with self.store.translate():
            async with self.store.engine.begin() as conn:
                for token, ids in _by_token(leased).items():
                    stmt = tasks_sql.hand_back(ids, token, self.dialect.now())
                    handed += list(await conn.execute(stmt))
        return handed

    async def rescue(self, limit: int = 1000) -> list[Any]:
        """Make tasks with an expired lease available again; (id, task, attempt, locked_by)."""
        with self.store.translate():
            async with self.store.engine.begin() as conn:
                return list(await conn.execute(tasks_sql.rescue(self.dialect.now(), limit)))

    # -- the operator's views -----------------------------------------------------------

    async def listing(
        self, state: TaskState | None, task: str | None, limit: int
    ) -> list[TaskRecord]:
        """Tasks newest first."""
        stmt = tasks_sql.listing(state.value if state else None, task, limit)
        return [record(r) for r in await self.store._read(stmt)]

    async def get(self, task_id: int) -> TaskRecord | None:
        """One task, or None."""
        rows = await self.store._read(tasks_sql.get(task_id))
        return record(rows[0]) if rows else None

    async def _change(self, stmt: Any) -> TaskRecord | None:
        await self.store.ensure_schema()
        with self.store.translate():
            async with self.store.engine.begin() as conn:
                row = (await conn.execute(stmt)).first()
        return record(row) if row is not None else None

    async def retry_now(self, task_id: int) -> TaskRecord | None:
        """Make a dead, discarded or waiting task run now; None if it is in no such state."""
        return await self._change(tasks_sql.retry_now(task_id, self.dialect.now()))

    async def discard(self, task_id: int) -> TaskRecord | None:
        """Discard a task that has not succeeded; None if it is in no such state."""
        return await self._change(tasks_sql.discard(task_id, self.dialect.now()))

    async def prune(self, before: datetime, batch: int = tasks_sql.PRUNE_BATCH) -> tuple[int, int]:
        """Delete tasks finished before `before` and claims made before it; (tasks, claims).

        In batches of at most `batch` rows, oldest first, each in a transaction of its own:
        workers and writers never wait behind a prune for longer than one batch, and an
        interrupted prune has deleted whole batches only (running it again goes on from there).
        """
        await self.store.ensure_schema()
        pruned_tasks = 0
        for state in tasks_sql.FINISHED:
            pruned_tasks += await self._delete_batches(tasks_sql.prune_tasks(state, before, batch))
        pruned_claims = await self._delete_batches(tasks_sql.prune_claims(before, batch))
        return pruned_tasks, pruned_claims

    async def _delete_batches(self, stmt: Any) -> int:
        """Run a batch DELETE (RETURNING the time of each row deleted), each time in its own
        transaction and from the newest time the last one deleted, until one deletes nothing;
        how many rows it deleted in all."""
        total, since = 0, _EARLIEST
        while True:
            with self.store.translate():
                async with self.store.engine.begin() as conn:
                    times = (await conn.execute(stmt, {"p_since": since})).scalars().all()
            if not times:
                return total
            total += len(times)
            since = max(times)

    async def count(self) -> dict[str, int]:
        """How many tasks are in each state."""
        return {r[0]: int(r[1]) for r in await self.store._read(tasks_sql.counts())}

    async def count_by_task(self) -> dict[str, dict[str, int]]:
        """For each task name that has rows: how many are in each state."""
        found: dict[str, dict[str, int]] = {}
        for name, state, n in await self.store._read(tasks_sql.counts_by_task()):
            found.setdefault(name, {})[state] = int(n)
        return found
