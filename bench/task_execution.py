"""How a worker runs its tasks: five transaction shapes measured on the same workloads.

Each option is a model of one transaction shape, written on raw asyncpg (and sqlite3 /
aiosqlite), not oncely's worker: the same `oncely_tasks` table (built by oncely's own
migrations), real leases (`FOR UPDATE SKIP LOCKED`, a token per lease), real acks (a
compare-and-set on id + lease token, its row count checked), real heartbeats.

  A     today: a connection per lane, a batch of tasks in one transaction, one ack
        statement at its end (the next batch leased in it); after a task that wrote fails,
        the transaction rolls back and runs again with a savepoint per task (the tasks
        that wrote before it run twice)
  A/sp  the same with a savepoint (its own round trip) before every task's first statement
        (what today's worker does for 20 transactions after a failure)
  B     a transaction per task on a connection per lane
  C     a transaction per task on a connection from one bounded pool, taken at the task's
        first statement and given back at its commit; concurrency >> pool size; a task
        that never touches the database is acked by a shared acker (many acks, one
        statement); leasing takes a pooled connection for one statement
  C+    C with its ack and COMMIT sent as one round trip (a lost lease aborts it)
  C2    C+ with the next transaction's BEGIN in that round trip too: a connection goes back
        to the pool inside a new, empty transaction (the next task sends no BEGIN)
  D     a batch in one transaction, a savepoint sent in the same round trip as each task's
        first statement ("SAVEPOINT; INSERT ..." as one simple query)
  E1    C with synchronous_commit = off in the task's transaction (opt-in only)
  E2    C with commit_delay / commit_siblings set on the pool's connections (needs a
        superuser or GRANT SET on Postgres 15+)

Workloads: (1) a one-row drain (each task inserts one row) at each --concurrency;
(2) I/O-bound tasks (sleep --io-wait, then insert one row; and C with no insert), peak
connections read from pg_stat_activity while it runs; (3) --writers tasks in one batch,
task --fail-at raising after its insert: body calls per task; (4) SQLite: how long an
app's INSERT on another connection takes while a task awaits before, or after, its write.

    python bench/task_execution.py --tasks 5000   # 12-15 min on a shared, loaded 2-core box
    python bench/task_execution.py --quick        # 2,000 tasks per drain, one round
Never a test: the numbers depend on the machine. tests/bench/ runs the smallest form for
its counts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

# -- the statements (a model of oncely's, on raw asyncpg) ----------------------------------

FILL = """
INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, created_at)
SELECT 'bench', 'default', jsonb_build_object('n', g), 'available', 0,
       clock_timestamp() - interval '1 second', clock_timestamp()
FROM generate_series(1, $1::int) AS g
"""
LEASE = """
UPDATE oncely_tasks SET state = 'running', attempt = attempt + 1, lease_token = $2,
    locked_by = 'bench', started_at = clock_timestamp(),
    lease_expires_at = clock_timestamp() + make_interval(secs => $3), finished_at = NULL
WHERE id IN (SELECT id FROM oncely_tasks
             WHERE state = 'available' AND run_at <= clock_timestamp()
             ORDER BY run_at, id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, (args ->> 'n')::int AS n
"""
ACK_BATCH = """
UPDATE oncely_tasks SET state = 'succeeded', finished_at = clock_timestamp(),
    lease_expires_at = NULL
WHERE id = ANY($1::bigint[]) AND lease_token = $2 AND state = 'running' RETURNING id
"""
ACK_ONE = """
UPDATE oncely_tasks SET state = 'succeeded', finished_at = clock_timestamp(),
    lease_expires_at = NULL
WHERE id = $1 AND lease_token = $2 AND state = 'running'
"""
ACK_MANY = """
UPDATE oncely_tasks AS t SET state = 'succeeded', finished_at = clock_timestamp(),
    lease_expires_at = NULL
FROM unnest($1::bigint[], $2::text[]) AS a(id, token)
WHERE t.id = a.id AND t.lease_token = a.token AND t.state = 'running' RETURNING t.id
"""
RETRY_ONE = """
UPDATE oncely_tasks SET state = 'available', error = $3, lease_token = NULL,
    lease_expires_at = NULL, run_at = clock_timestamp() + interval '1 hour'
WHERE id = $1 AND lease_token = $2 AND state = 'running'
"""
RETRY_MANY = """
UPDATE oncely_tasks AS t SET state = 'available', error = a.error, lease_token = NULL,
    lease_expires_at = NULL, run_at = clock_timestamp() + interval '1 hour'
FROM unnest($1::bigint[], $2::text[], $3::text[]) AS a(id, token, error)
WHERE t.id = a.id AND t.lease_token = a.token AND t.state = 'running' RETURNING t.id
"""
HEARTBEAT = """
UPDATE oncely_tasks AS t SET lease_expires_at = clock_timestamp() + make_interval(secs => $3)
FROM unnest($1::bigint[], $2::text[]) AS a(id, token)
WHERE t.id = a.id AND t.lease_token = a.token AND t.state = 'running' RETURNING t.id
"""
ACK_AND_COMMIT = """
WITH acked AS (
    UPDATE oncely_tasks SET state = 'succeeded', finished_at = clock_timestamp(),
        lease_expires_at = NULL
    WHERE id = {id:d} AND lease_token = '{token}' AND state = 'running' RETURNING 1
)
SELECT 1 / count(*) FROM acked; COMMIT
"""
"""Option C+: the ack and the COMMIT as one simple query (one round trip). A lost lease
matches no row and divides by zero, which aborts the transaction before its COMMIT runs.
Its only values are a task id (an int) and a lease token this worker made (hex digits)."""
REOPEN = "; BEGIN; SET LOCAL synchronous_commit TO on"
"""Option C2: sent after the COMMIT (or ROLLBACK) in the same round trip, so the connection
goes back to the pool inside a new, empty transaction and the next task's first statement
needs no BEGIN of its own (its transaction's now() is then the time of that BEGIN)."""
INSERT_EFFECT = "INSERT INTO bench_effects (n) VALUES ($1)"
DURABLE = "BEGIN; SET LOCAL synchronous_commit TO on"
"""Every connection here opens with synchronous_commit = off (a lease needs no fsync of its
own, as in oncely); a transaction that holds a task's work makes its commit durable."""
PEAK = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'"
)
RUNNING_ONLY = {"synchronous_commit": "off"}


class TaskFailed(Exception):
    """The failure workload's task raises this after its insert."""


def token() -> str:
    return secrets.token_hex(16)


def literal(sql: str, args: tuple[Any, ...]) -> str:
    """`sql` with its integer parameters written in: asyncpg cannot send a parameterized
    statement behind a SAVEPOINT in one round trip, and this bench's task statements take
    integers only (option D's stand-in for a pipelined savepoint)."""
    for i, arg in reversed(list(enumerate(args, 1))):
        if type(arg) is not int:
            raise TypeError(f"option D's pipelined savepoint takes integer parameters, not {arg!r}")
        sql = sql.replace(f"${i}", str(arg))
    return sql


# -- what a task's body is handed ----------------------------------------------------------


class Db:
    """A task's database handle. On its first statement it opens what the option opens (a
    transaction, a savepoint, a pooled connection); later statements go straight through."""

    def __init__(self, conn: Any = None, *, first: str = "", pipelined: bool = False) -> None:
        self.conn = conn
        self.first = first  # sent before (or, pipelined, with) the first statement
        self.pipelined = pipelined
        self.wrote = False
        self.pool: Pool | None = None

    async def execute(self, sql: str, *args: Any) -> str:
        if not self.wrote:
            self.wrote = True
            if self.conn is None:
                assert self.pool is not None
                self.conn = await self.pool.acquire()
                if id(self.conn) in self.pool.primed:  # C2: already inside a new transaction
                    self.pool.primed.discard(id(self.conn))
                    return str(await self.conn.execute(sql, *args))
            if self.pipelined:
                return str(await self.conn.execute(f"{self.first}; {literal(sql, args)}"))
            if self.first:
                await self.conn.execute(self.first)
        return str(await self.conn.execute(sql, *args))


Body = Callable[[Db, int], Awaitable[None]]


def one_row() -> Body:
    async def body(db: Db, n: int) -> None:
        await db.execute(INSERT_EFFECT, n)

    return body


def io(wait: float, write: bool) -> Body:
    async def body(db: Db, n: int) -> None:
        await asyncio.sleep(wait)
        if write:
            await db.execute(INSERT_EFFECT, n)

    return body


def failing(at: int) -> Body:
    async def body(db: Db, n: int) -> None:
        await db.execute(INSERT_EFFECT, n)
        if n == at:
            raise TaskFailed(f"task {n} fails after its insert")

    return body


# -- connections ---------------------------------------------------------------------------


class Pool:
    """A bounded pool that opens a connection only when every open one is taken."""

    def __init__(self, dsn: str, size: int, settings: dict[str, str]) -> None:
        self.dsn, self.settings = dsn, settings
        self.free: list[Any] = []
        self.slots = asyncio.Semaphore(size)
        self.opened = 0
        self.primed: set[int] = set()  # C2: connections given back inside a new transaction

    async def acquire(self) -> Any:
        await self.slots.acquire()
        if self.free:
            return self.free.pop()
        try:
            conn = await asyncpg.connect(self.dsn, server_settings=self.settings)
        except BaseException:
            self.slots.release()
            raise
        self.opened += 1
        return conn

    def release(self, conn: Any) -> None:
        self.free.append(conn)
        self.slots.release()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A connection for a statement of the worker's own (lease, ack, heartbeat)."""
        conn = await self.acquire()
        if id(conn) in self.primed:  # C2: end the empty transaction first (no WAL, no fsync)
            self.primed.discard(id(conn))
            await conn.execute("COMMIT")
        try:
            yield conn
        finally:
            self.release(conn)

    async def close(self) -> None:
        for conn in self.free:
            await conn.close()
        self.free.clear()


@dataclass
class Run:
    """What one drain did: its counts (checked by the smoke test) and its peaks."""

    held: dict[int, str] = field(default_factory=dict)  # leased, not yet finished: id -> token
    calls: Counter[int] = field(default_factory=Counter)  # body calls by task number
    finished: int = 0
    lost: int = 0
    reruns: int = 0
    heartbeats: int = 0
    opened: int = 0


async def heartbeats(pool: Pool, run: Run, lease: float) -> None:
    """Renew every in-flight lease in one statement, every lease / 3."""
    while True:
        await asyncio.sleep(lease / 3)
        if run.held:
            ids, toks = list(run.held), list(run.held.values())
            async with pool.connection() as conn:
                await conn.fetch(HEARTBEAT, ids, toks, lease)
            run.heartbeats += 1


class Peak:
    """Samples the drain database's client connections in pg_stat_activity, from a
    connection to another database (so the sampler is not counted)."""

    def __init__(self, admin: str, database: str) -> None:
        self.admin, self.database, self.peak = admin, database, 0

    async def __aenter__(self) -> Peak:
        self.conn = await asyncpg.connect(self.admin)
        self.task = asyncio.create_task(self._sample())
        return self

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, await self.conn.fetchval(PEAK, self.database))
            await asyncio.sleep(0.005)

    async def __aexit__(self, *exc: object) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.peak = max(self.peak, await self.conn.fetchval(PEAK, self.database))
        await self.conn.close()


# -- A, A/sp, D: a batch in one transaction per lane ---------------------------------------


async def run_batch(
    conn: Any, rows: list[Any], tok: str, body: Body, mode: str, run: Run
) -> list[int]:
    """Run a leased batch's tasks in the open transaction; return the ids to ack.

    mode "rerun" (A): no savepoints; when a task fails with writes in the transaction, roll
    it back and run it again with savepoints: the tasks that wrote before it run a second
    time, the failed one is not run again (its retry is recorded). "savepoint" (A/sp): a
    savepoint round trip before each task's first statement. "pipelined" (D): the savepoint
    in the same round trip as the first statement."""
    ok: list[int] = []
    wrote: dict[int, bool] = {}
    for i, row in enumerate(rows):
        db = Db(
            conn, first="SAVEPOINT task" if mode != "rerun" else "", pipelined=mode == "pipelined"
        )
        run.calls[row["n"]] += 1
        try:
            await body(db, row["n"])
        except Exception as exc:
            if mode != "rerun":
                if db.wrote:
                    await conn.execute("ROLLBACK TO SAVEPOINT task")
            elif db.wrote or any(wrote.values()):
                run.reruns += 1
                await conn.execute("ROLLBACK")
                await conn.execute(DURABLE)
                mode = "savepoint"  # the rest of this transaction keeps savepoints
                ok = []
                for before in rows[:i]:
                    if wrote[before["id"]]:  # ran again: its first run's work rolled back
                        run.calls[before["n"]] += 1
                        await body(Db(conn, first="SAVEPOINT task"), before["n"])
                    ok.append(before["id"])
            await conn.execute(RETRY_ONE, row["id"], tok, repr(exc))
            run.finished += 1
            continue
        wrote[row["id"]] = db.wrote
        ok.append(row["id"])
    return ok


async def batch_lane(dsn: str, body: Body, batch: int, mode: str, lease: float, run: Run) -> None:
    conn = await asyncpg.connect(dsn, server_settings=RUNNING_ONLY)
    run.opened += 1
    try:
        tok = token()
        rows = await conn.fetch(LEASE, batch, tok, lease)  # autocommitted, no fsync of its own
        while rows:
            run.held.update((r["id"], tok) for r in rows)
            await conn.execute(DURABLE)
            ok = await run_batch(conn, rows, tok, body, mode, run)
            acked = await conn.fetch(ACK_BATCH, ok, tok)
            run.lost += len(ok) - len(acked)
            nxt = token()
            nxt_rows = await conn.fetch(LEASE, batch, nxt, lease)  # in the same transaction
            await conn.execute("COMMIT")
            run.finished += len(acked)
            for r in rows:
                run.held.pop(r["id"], None)
            rows, tok = nxt_rows, nxt
    finally:
        await conn.close()


# -- B: a transaction per task, a connection per lane --------------------------------------


async def task_lane(dsn: str, body: Body, batch: int, lease: float, run: Run) -> None:
    conn = await asyncpg.connect(dsn, server_settings=RUNNING_ONLY)
    run.opened += 1
    try:
        while True:
            tok = token()
            rows = await conn.fetch(LEASE, batch, tok, lease)
            if not rows:
                return
            run.held.update((r["id"], tok) for r in rows)
            for row in rows:
                db = Db(conn, first=DURABLE)  # BEGIN at the task's first statement
                run.calls[row["n"]] += 1
                try:
                    await body(db, row["n"])
                except Exception as exc:
                    if db.wrote:
                        await conn.execute("ROLLBACK")
                    await conn.execute(RETRY_ONE, row["id"], tok, repr(exc))
                else:
                    if not db.wrote:
                        await conn.execute(DURABLE)
                    if await conn.execute(ACK_ONE, row["id"], tok) == "UPDATE 1":
                        await conn.execute("COMMIT")
                    else:  # the lease was lost: the work rolls back with the ack
                        await conn.execute("ROLLBACK")
                        run.lost += 1
                run.finished += 1
                run.held.pop(row["id"], None)
    finally:
        await conn.close()


async def drain_lanes(
    dsn: str, shape: str, body: Body, lanes: int, batch: int, lease: float, run: Run
) -> None:
    side = Pool(dsn, 1, RUNNING_ONLY)  # the heartbeat's connection
    beat = asyncio.create_task(heartbeats(side, run, lease))
    try:
        if shape == "B":
            lanes_run = [task_lane(dsn, body, batch, lease, run) for _ in range(lanes)]
        else:
            mode = {"A": "rerun", "A/sp": "savepoint", "D": "pipelined"}[shape]
            lanes_run = [batch_lane(dsn, body, batch, mode, lease, run) for _ in range(lanes)]
        # Every lane ends (the others drain what a lane that failed to connect left) before
        # the first error, if any, is raised.
        for outcome in await asyncio.gather(*lanes_run, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
        run.opened += side.opened
        await side.close()


# -- C, E1, E2: a transaction per task on a bounded pool -----------------------------------


class Acker:
    """Acks (and retry records) of tasks that hold no transaction, many per statement."""

    def __init__(self, pool: Pool, run: Run, done: Callable[[int], None]) -> None:
        self.pool, self.run, self.done = pool, run, done
        self.acks: list[tuple[int, str]] = []
        self.retries: list[tuple[int, str, str]] = []
        self.wake = asyncio.Event()

    def ack(self, task_id: int, tok: str) -> None:
        self.acks.append((task_id, tok))
        self.wake.set()

    def retry(self, task_id: int, tok: str, error: str) -> None:
        self.retries.append((task_id, tok, error))
        self.wake.set()

    async def serve(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            acks, self.acks = self.acks, []
            retries, self.retries = self.retries, []
            async with self.pool.connection() as conn:
                await conn.execute(DURABLE)
                if acks:
                    acked = await conn.fetch(ACK_MANY, [a[0] for a in acks], [a[1] for a in acks])
                    self.run.lost += len(acks) - len(acked)
                if retries:
                    ids, toks, errors = (list(c) for c in zip(*retries, strict=True))
                    await conn.fetch(RETRY_MANY, ids, toks, errors)
                await conn.execute("COMMIT")
            for task_id, *_ in acks + retries:
                self.done(task_id)


async def drain_pooled(
    dsn: str,
    body: Body,
    total: int,
    concurrency: int,
    pool_size: int,
    lease: float,
    run: Run,
    *,
    begin: str = DURABLE,
    settings: dict[str, str] | None = None,
    ack_and_commit: bool = False,
    reopen: bool = False,
) -> None:
    pool = Pool(dsn, pool_size, {**RUNNING_ONLY, **(settings or {})})
    prefetch = min(concurrency, 50)  # leased ahead, so runners never wait on a lease
    ready: asyncio.Queue[Any] = asyncio.Queue()
    room, all_done = asyncio.Event(), asyncio.Event()

    def done(task_id: int) -> None:
        run.held.pop(task_id, None)
        run.finished += 1
        room.set()
        if run.finished >= total:
            all_done.set()

    acker = Acker(pool, run, done)

    async def leaser() -> None:
        least = max(1, (concurrency + prefetch) // 4)
        while True:
            free = concurrency + prefetch - len(run.held)
            if free < least and run.held:
                room.clear()
                await room.wait()
                continue
            tok = token()
            async with pool.connection() as conn:  # one statement, then the connection goes back
                rows = await conn.fetch(LEASE, min(free, 500), tok, lease)
            for row in rows:
                run.held[row["id"]] = tok
                ready.put_nowait(row)
            if not rows:
                await asyncio.sleep(0.01)  # a worker would wait for NOTIFY or its poll

    async def attempt(row: Any) -> None:
        db = Db(first=begin)
        db.pool = pool
        run.calls[row["n"]] += 1
        try:
            await body(db, row["n"])
        except Exception as exc:
            if db.conn is not None:
                await db.conn.execute("ROLLBACK" + (REOPEN if reopen else ""))
                if reopen:
                    pool.primed.add(id(db.conn))
                pool.release(db.conn)
            acker.retry(row["id"], row_token(row), repr(exc))
            return
        if db.conn is None:  # never touched the database: no connection, a batched ack
            acker.ack(row["id"], row_token(row))
            return
        try:
            if ack_and_commit:
                tok = row_token(row)
                assert all(ch in "0123456789abcdef" for ch in tok)
                try:
                    ack = ACK_AND_COMMIT.format(id=row["id"], token=tok)
                    await db.conn.execute(ack + (REOPEN if reopen else ""))
                    if reopen:
                        pool.primed.add(id(db.conn))
                except asyncpg.DivisionByZeroError:  # the lease was lost: nothing committed
                    await db.conn.execute("ROLLBACK")
                    run.lost += 1
            elif await db.conn.execute(ACK_ONE, row["id"], row_token(row)) == "UPDATE 1":
                await db.conn.execute("COMMIT")
            else:  # the lease was lost: the work rolls back with the ack
                await db.conn.execute("ROLLBACK")
                run.lost += 1
        finally:
            pool.release(db.conn)
        done(row["id"])

    def row_token(row: Any) -> str:
        return run.held[row["id"]]

    async def runner() -> None:
        while True:
            await attempt(await ready.get())

    tasks = [asyncio.create_task(leaser()), asyncio.create_task(acker.serve())]
    tasks.append(asyncio.create_task(heartbeats(pool, run, lease)))
    tasks += [asyncio.create_task(runner()) for _ in range(concurrency)]
    try:
        finished = asyncio.create_task(all_done.wait())
        await asyncio.wait([finished, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:  # a crashed service ends the drain with its error
            if task.done():
                task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        run.opened += pool.opened
        await pool.close()


# -- one measurement -----------------------------------------------------------------------


@dataclass
class Cell:
    workload: str
    option: str
    concurrency: int
    connections: str
    tasks: int
    rate: float = 0.0
    peak: int = 0
    run: Run = field(default_factory=Run)
    effects: int = 0
    succeeded: int = 0
    cpu_us: float = 0.0  # this process's CPU time per task (the worker's side only)


async def fill(dsn: str, count: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("TRUNCATE oncely_tasks, bench_effects RESTART IDENTITY")
        await conn.execute(FILL, count)
        await conn.execute("ANALYZE oncely_tasks")
    finally:
        await conn.close()


async def measure(
    ctx: Context, cell: Cell, body: Body, pool_size: int = 0, batch: int = 50
) -> Cell:
    await fill(ctx.dsn, cell.tasks)
    run = Run()
    option = cell.option
    async with Peak(ctx.admin, ctx.database) as peak:
        started, cpu = time.perf_counter(), time.process_time()
        if option in ("A", "A/sp", "B", "D"):
            await drain_lanes(ctx.dsn, option, body, cell.concurrency, batch, ctx.lease, run)
        else:
            extra: dict[str, Any] = {}
            if option.startswith("E1"):
                extra["begin"] = "BEGIN"  # the pool's synchronous_commit = off holds
            if option.startswith("E2"):
                extra["settings"] = ctx.commit_delay
            if option in ("C+", "C2"):
                extra["ack_and_commit"] = True
            if option == "C2":
                extra["reopen"] = True
            await drain_pooled(
                ctx.dsn, body, cell.tasks, cell.concurrency, pool_size, ctx.lease, run, **extra
            )
        elapsed = time.perf_counter() - started
        cell.cpu_us = (time.process_time() - cpu) / cell.tasks * 1e6
    conn = await asyncpg.connect(ctx.dsn)
    try:
        cell.effects = await conn.fetchval("SELECT count(*) FROM bench_effects")
        cell.succeeded = await conn.fetchval(
            "SELECT count(*) FROM oncely_tasks WHERE state = 'succeeded'"
        )
    finally:
        await conn.close()
    cell.rate, cell.peak, cell.run = cell.tasks / elapsed, peak.peak, run
    return cell


@dataclass
class Context:
    admin: str
    dsn: str
    database: str
    lease: float
    commit_delay: dict[str, str]
    room: int


async def measure_cell(
    cells: dict[tuple[str, str, int], Cell], cell: Cell, measuring: Awaitable[Cell]
) -> None:
    """Measure a cell and keep its best round; a server out of connections (the machine is
    shared) skips the cell for this round, and says so."""
    try:
        best(cells, await measuring)
    except asyncpg.TooManyConnectionsError:
        print(
            f"  {cell.workload:10} {cell.option:5} c={cell.concurrency:<5} skipped this round:"
            " the server had no connections left",
            flush=True,
        )


def best(cells: dict[tuple[str, str, int], Cell], cell: Cell) -> None:
    key = (cell.workload, cell.option, cell.concurrency)
    old = cells.get(key)
    if old is None or cell.rate > old.rate:
        cells[key] = cell
    print(
        f"  {cell.workload:10} {cell.option:5} c={cell.concurrency:<5} {cell.rate:10.1f}/s"
        f"  cpu {cell.cpu_us:5.0f} us/task  peak {cell.peak:3}  effects {cell.effects}"
        f"  calls {sum(cell.run.calls.values())}",
        flush=True,
    )


ONE_ROW = ["A", "A/sp", "B", "C", "C+", "C2", "D", "E1", "E2"]
IO = ["A", "B", "D", "C", "C+", "C2", "C no-DB", "E1", "E2"]
FAILURE = ["A", "A/sp", "B", "C", "D"]


async def postgres(
    args: argparse.Namespace, cells: dict[tuple[str, str, int], Cell]
) -> dict[int, tuple[float, str]]:
    from queues import connection_room, fresh_database

    from oncely import Oncely

    admin = args.database_url.replace("postgresql+asyncpg://", "postgresql://")
    database = f"{args.database_prefix}_exec"
    dsn = await fresh_database(admin, database)
    app = Oncely(dsn)
    await app.migrate()
    await app.aclose()
    delay = {"commit_delay": str(args.commit_delay), "commit_siblings": str(args.commit_siblings)}
    ctx = Context(admin, dsn, database, args.lease, delay, await connection_room(admin))
    delay_ok = await settable(dsn, delay)
    if not delay_ok:
        print("E2: commit_delay is not settable per session for this role: skipped", flush=True)
    peers: dict[int, tuple[float, str]] = {}
    pgq = await pgqueuer(args, admin) if args.pgqueuer else None
    try:
        for round_no in range(args.rounds):
            print(f"round {round_no + 1}/{args.rounds}", flush=True)
            for c in args.concurrency:
                for option in ONE_ROW:
                    if option in ("A", "A/sp", "B", "D") and c + 2 > await connection_room(admin):
                        continue  # a lane per task at once: more connections than are left
                    if option == "E2" and not delay_ok:
                        continue
                    pool = min(args.pool_size, c)
                    conns = f"pool {pool}" if option[0] in "CE" else f"{c} lanes"
                    cell = Cell("one-row", option, c, conns, args.tasks)
                    await measure_cell(cells, cell, measure(ctx, cell, one_row(), pool, args.batch))
                if pgq is not None:
                    system, drain = pgq
                    for shape in system.shapes(c):
                        try:
                            rate = await drain(system, "one_row", args.tasks, c, shape)
                        except asyncpg.TooManyConnectionsError:
                            print(
                                f"  one-row    pgqueuer c={c:<5} skipped this round ({shape}):"
                                " the server had no connections left",
                                flush=True,
                            )
                            continue
                        print(f"  one-row    pgqueuer c={c:<5} {rate:10.1f}/s  {shape}", flush=True)
                        if rate > peers.get(c, (0.0, ""))[0]:
                            peers[c] = (rate, shape)
            for option in IO:
                if option == "E2" and not delay_ok:
                    continue
                if option in ("A", "B", "D"):
                    lanes = min(args.io_pool_size, ctx.room - 2)
                    cell = Cell("I/O", option, lanes, f"{lanes} lanes", args.io_lane_tasks)
                    body = io(args.io_wait, write=True)
                    batch = max(1, round(1 / args.io_wait))  # about a second of work
                    await measure_cell(cells, cell, measure(ctx, cell, body, batch=batch))
                else:
                    n = args.io_concurrency
                    cell = Cell("I/O", option, n, f"pool {args.io_pool_size}", args.io_tasks)
                    body = io(args.io_wait, write=option != "C no-DB")
                    await measure_cell(cells, cell, measure(ctx, cell, body, args.io_pool_size))
            for option in FAILURE:
                c = 10 if option == "C" else 1
                conns = "pool 10" if option == "C" else "1 lane"
                cell = Cell("failure", option, c, conns, args.writers)
                await measure_cell(
                    cells, cell, measure(ctx, cell, failing(args.fail_at), 10, args.writers)
                )
    finally:
        if pgq is not None:
            await pgq[0].close()
        await drop(admin, database)
        if pgq is not None:
            await drop(admin, f"{args.database_prefix}_pgqueuer")
    return peers


async def settable(dsn: str, settings: dict[str, str]) -> bool:
    try:
        conn = await asyncpg.connect(dsn, server_settings=settings)
    except asyncpg.PostgresError:
        return False
    await conn.close()
    return True


async def pgqueuer(args: argparse.Namespace, admin: str) -> tuple[Any, Any] | None:
    """pgqueuer's one-row drain from bench/queues.py, in both of its shapes."""
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        print("pgqueuer is not installed (pip install -r bench/requirements.txt): skipped")
        return None
    from queues import PgQueuer, connection_room, drain, fresh_database

    system = PgQueuer()
    await system.setup(await fresh_database(admin, f"{args.database_prefix}_pgqueuer"))
    system.room = await connection_room(admin)
    return system, drain


async def drop(admin: str, database: str) -> None:
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    finally:
        await conn.close()


# -- SQLite: what a task's await costs the app's writers -----------------------------------


async def sqlite_case(path: str, shape: str, when: str, wait: float, busy_ms: int) -> float:
    """The app's one INSERT (autocommit, busy_timeout = busy_ms) on its own connection, timed
    while the task awaits `wait` s `when` ("before" / "after") its write; in ms."""
    import aiosqlite

    awaiting = asyncio.Event()
    async with aiosqlite.connect(path, isolation_level=None) as task_conn:
        await task_conn.execute(f"PRAGMA busy_timeout = {busy_ms:d}")

        async def task() -> None:
            if shape == "today":  # the batch's transaction takes the write lock at once
                await task_conn.execute("BEGIN IMMEDIATE")
            if when == "after":
                if shape != "today":
                    await task_conn.execute("BEGIN")  # deferred: the lock comes with the write
                await task_conn.execute("INSERT INTO bench_effects (n) VALUES (1)")
            awaiting.set()
            await asyncio.sleep(wait)  # the task's I/O
            if when == "before":
                if shape != "today":
                    await task_conn.execute("BEGIN")
                await task_conn.execute("INSERT INTO bench_effects (n) VALUES (1)")
            await task_conn.execute("UPDATE oncely_tasks SET state = 'succeeded' WHERE id = 1")
            await task_conn.execute("COMMIT")

        def app_insert() -> float:
            conn = sqlite3.connect(path, timeout=busy_ms / 1000, isolation_level=None)
            try:
                started = time.perf_counter()
                conn.execute("INSERT INTO app_rows (n) VALUES (1)")
                return (time.perf_counter() - started) * 1000
            finally:
                conn.close()

        running = asyncio.create_task(task())
        await awaiting.wait()
        took = await asyncio.to_thread(app_insert)
        await running
    return took


async def sqlite(args: argparse.Namespace) -> dict[tuple[str, str], list[float]]:
    from oncely import Oncely

    out: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "bench.db")
        app = Oncely(f"sqlite+aiosqlite:///{path}")
        await app.migrate()
        await app.aclose()
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE bench_effects (n integer)")
        conn.execute("CREATE TABLE app_rows (n integer)")
        now = datetime.now(timezone.utc).isoformat()
        conn.execute(
            "INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, created_at)"
            " VALUES ('bench', 'default', '{}', 'running', 1, ?, ?)",
            (now, now),
        )
        conn.close()
        for _ in range(args.sqlite_repeats):
            for shape in ("today", "per task"):
                for when in ("before", "after"):
                    took = await sqlite_case(path, shape, when, args.sqlite_wait, args.busy_ms)
                    out.setdefault((shape, when), []).append(took)
                    print(
                        f"  sqlite     {shape:8} awaits {when} writing: app INSERT {took:8.1f} ms"
                    )
    return out


# -- the report ----------------------------------------------------------------------------


def report(
    args: argparse.Namespace,
    cells: dict[tuple[str, str, int], Cell],
    peers: dict[int, tuple[float, str]],
    lite: dict[tuple[str, str], list[float]],
) -> None:
    print(
        f"\n{args.tasks} one-row tasks per drain, {args.io_tasks} I/O tasks for C and E "
        f"({args.io_lane_tasks} for the lanes), best of {args.rounds} rounds, lease "
        f"{args.lease:g} s, E2: commit_delay {args.commit_delay} us, commit_siblings "
        f"{args.commit_siblings}\n"
    )
    print(
        "| workload | option | concurrency | connections | tasks | tasks/s | x A "
        "| worker CPU us/task | peak conns | body calls | effects | succeeded |"
    )
    print("|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for workload in ("one-row", "I/O", "failure"):
        group = [c for c in cells.values() if c.workload == workload]
        for cell in sorted(group, key=lambda c: c.concurrency if workload == "one-row" else 0):
            base = [
                c
                for c in group
                if c.option == "A" and (workload != "one-row" or c.concurrency == cell.concurrency)
            ]
            ratio = f"{cell.rate / base[0].rate:.2f}" if base and workload != "failure" else "-"
            rate = f"{cell.rate:,.0f}" if workload != "failure" else "-"
            calls = cell.run.calls
            twice = sum(1 for v in calls.values() if v > 1)
            print(
                f"| {workload} | {cell.option} | {cell.concurrency} | {cell.connections} "
                f"| {cell.tasks} | {rate} | {ratio} | {cell.cpu_us:,.0f} | {cell.peak} "
                f"| {sum(calls.values())} ({twice} twice) | {cell.effects} | {cell.succeeded} |"
            )
        if workload == "one-row":
            for c in args.concurrency:
                if c not in peers:
                    continue
                rate, shape = peers[c]
                base = cells.get(("one-row", "A", c))
                ratio = f"{rate / base.rate:.2f}" if base else "n/a"
                print(
                    f"| one-row | pgqueuer ({shape}) | {c} | - "
                    f"| {args.tasks} | {rate:,.0f} | {ratio} | - | - | - | {args.tasks} | - |"
                )
    if lite:
        print(
            f"\nSQLite: the app's INSERT on its own connection (busy_timeout {args.busy_ms} ms)"
            f" while a task awaits {args.sqlite_wait:g} s; median (max) of "
            f"{args.sqlite_repeats}, ms\n"
        )
        print("| the task awaits | today: BEGIN IMMEDIATE per batch | per task: deferred BEGIN |")
        print("|---|--:|--:|")
        for when in ("before", "after"):
            row = []
            for shape in ("today", "per task"):
                took = lite[shape, when]
                row.append(f"{statistics.median(took):,.1f} ({max(took):,.1f})")
            print(f"| {when} its first write | {row[0]} | {row[1]} |")
    load = os.getloadavg()
    print(
        f"\n{platform.node()}: {os.cpu_count()} cores, load average {load[0]:.1f} "
        f"{load[1]:.1f} {load[2]:.1f} at the end"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database-prefix", default="bench_exec")
    parser.add_argument("--quick", action="store_true", help="2,000 tasks per drain, 1 round")
    parser.add_argument("--tasks", type=int, help="one-row tasks per drain (10,000)")
    parser.add_argument("--concurrency", default="10,50", help="one-row drain concurrencies")
    parser.add_argument("--batch", type=int, default=50, help="tasks per lane transaction (A, D)")
    parser.add_argument("--pool-size", type=int, default=10, help="the pool of C and E (10)")
    parser.add_argument("--io-tasks", type=int, help="I/O tasks for C and E (10,000)")
    parser.add_argument("--io-lane-tasks", type=int, help="I/O tasks for A, B, D (1,000)")
    parser.add_argument("--io-concurrency", type=int, default=1000)
    parser.add_argument("--io-pool-size", type=int, default=20)
    parser.add_argument("--io-wait", type=float, default=0.1, help="each I/O task's await, s")
    parser.add_argument("--writers", type=int, default=50)
    parser.add_argument("--fail-at", type=int, default=25)
    parser.add_argument("--lease", type=float, default=3.0, help="s (heartbeat every lease/3)")
    parser.add_argument("--commit-delay", type=int, default=1000, help="E2's, microseconds")
    parser.add_argument("--commit-siblings", type=int, default=5)
    parser.add_argument("--sqlite-wait", type=float, default=1.0)
    parser.add_argument("--sqlite-repeats", type=int)
    parser.add_argument("--busy-ms", type=int, default=5000, help="the app's busy_timeout")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--no-pgqueuer", dest="pgqueuer", action="store_false")
    parser.add_argument("--no-sqlite", dest="sqlite", action="store_false")
    parser.add_argument("--no-postgres", dest="postgres", action="store_false")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {
        "tasks": 2000 if quick else 10_000,
        "io_tasks": 2000 if quick else 10_000,
        "io_lane_tasks": 400 if quick else 1000,
        "rounds": 1 if quick else 2,
        "sqlite_repeats": 1 if quick else 3,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        parser.error(f"--concurrency: a comma-separated list of integers, not {args.concurrency!r}")
    counts = (
        "tasks",
        "io_tasks",
        "io_lane_tasks",
        "rounds",
        "sqlite_repeats",
        "batch",
        "pool_size",
        "io_concurrency",
        "io_pool_size",
        "writers",
    )
    for name in counts:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if min(args.concurrency) < 1:
        parser.error("--concurrency must be >= 1")
    if not 1 <= args.fail_at <= args.writers or args.writers > args.batch:
        parser.error("--fail-at must be within --writers, and --writers <= --batch")
    if not (args.io_wait > 0 and args.lease > 0 and args.sqlite_wait > 0):
        parser.error("--io-wait, --lease and --sqlite-wait must be > 0")
    return args


async def main(args: argparse.Namespace) -> None:
    cells: dict[tuple[str, str, int], Cell] = {}
    peers: dict[int, tuple[float, str]] = {}
    lite: dict[tuple[str, str], list[float]] = {}
    print(
        f"started {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, load average "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    if args.postgres:
        peers = await postgres(args, cells)
    if args.sqlite:
        lite = await sqlite(args)
    report(args, cells, peers, lite)


if __name__ == "__main__":
    asyncio.run(main(parse()))
