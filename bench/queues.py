"""Queue benchmark: oncely, procrastinate and pgqueuer side by side, on one Postgres, in one run.

    pip install -r bench/requirements.txt
    python bench/queues.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

For each system, in a fresh database of its own: enqueue rate (one task per transaction, one
autocommitted task, and batches; oncely both on an AsyncSession and on a bare asyncpg
connection, pgqueuer's own rows being on asyncpg), drain throughput of N no-op tasks and of N
tasks that insert one row, at each concurrency (oncely's one-row task inserts through its
session; in `one_row_driver` it inserts on the asyncpg connection it asks its session for,
`oncely.asyncpg_connection`, as the peers' tasks do in both; oncely also with limits: the
one-row task with a concurrency key of 1 over 8 keys, and with a rate), and enqueue-to-start latency
(p50/p99) with the worker idle. Concurrency is each system's own knob; pgqueuer is measured in
both of its shapes (one manager dequeuing N per batch; N managers of batch 10) and the better is
kept, and a cell that would need more connections than the server has left is n/a. Each
measurement is repeated --rounds times, systems interleaved, and the best round is kept (the
machine is shared; the best round is the least disturbed). oncely's one-row task inserts its row
in the task's own transaction, with the ack; the peers' tasks insert theirs on a pooled
connection, in a transaction separate from the job's completion (they have no way to share it).
Never a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

EFFECTS = "CREATE TABLE IF NOT EXISTS bench_effects (n bigint)"


def dsn_for(base: str, name: str) -> str:
    head, _, _ = base.rpartition("/")
    return f"{head}/{name}"


async def fresh_database(base: str, name: str, durable: bool = True) -> str:
    admin = await asyncpg.connect(base)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
        if not durable:
            await admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    finally:
        await admin.close()
    dsn = dsn_for(base, name)
    conn = await asyncpg.connect(dsn)
    await conn.execute(EFFECTS)
    await conn.close()
    return dsn


async def drop_databases(base: str, names: list[str]) -> None:
    """Drop the databases this run made (its connections closed or cut)."""
    admin = await asyncpg.connect(base)
    try:
        for name in names:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def wait_empty(dsn: str, query: str, timeout: float = 600) -> None:
    """Wait until `query` (a count of pending jobs, on a partial index) says 0."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn = await asyncpg.connect(dsn)
        try:
            while await conn.fetchval(query):
                if time.monotonic() > deadline:
                    raise TimeoutError(query)
                await asyncio.sleep(0.02)
            return
        except asyncpg.InterfaceError:
            continue  # a broken connection: poll on a new one
        finally:
            await conn.close()
    raise TimeoutError(query)


class System:
    """One queue under test: how to set it up, enqueue, drain and time a start."""

    name = ""
    room = 90  # connections this system may open at once (the server's max less a margin)
    drains: tuple[str, ...] = ("noop", "one_row", "one_row_driver")
    """The drains it has tasks for (keyed and rated need per-key and rate limits)."""

    def shapes(self, concurrency: int) -> list[str]:
        """The ways this system runs at `concurrency`; each is measured, the best is kept."""
        return [""]

    async def setup(self, dsn: str) -> None: ...
    async def reset(self) -> None: ...
    async def enqueue_one(self, task: str, n: int) -> None: ...

    async def enqueue_sent(self, task: str, n: int) -> float:
        """`enqueue_one`, returning when the statement that commits the task was sent (the
        latency's start). A system whose enqueue is one autocommitted statement sends it as it
        is called."""
        sent = time.perf_counter()
        await self.enqueue_one(task, n)
        return sent

    async def enqueue_in(self, task: str, n: int, transaction: bool) -> None:
        """One task in a transaction of its own (BEGIN, insert, COMMIT), or one autocommitted
        statement; a system that has only one way uses it for both."""
        await self.enqueue_one(task, n)

    async def enqueue_batch(self, task: str, ns: list[int]) -> None: ...

    driver_enqueue = False
    """Whether the system also enqueues on a bare asyncpg connection apart from its usual
    way (oncely: an AsyncSession, or an asyncpg connection); pgqueuer's usual way is one."""

    async def enqueue_in_driver(self, task: str, n: int, transaction: bool) -> None: ...
    async def enqueue_batch_driver(self, task: str, ns: list[int]) -> None: ...
    async def enqueue_floor(self, task: str, n: int, transaction: bool) -> None: ...

    async def drain(self, total: int, concurrency: int, shape: str) -> None: ...
    async def start_idle_worker(self) -> Callable[[], Awaitable[None]]: ...
    async def close(self) -> None: ...

    started: dict[int, float]


# -- oncely -------------------------------------------------------------------------------

FLOOR_INSERT_SQL = (
    "INSERT INTO oncely_tasks (task, queue, args, state, run_at, created_at)"
    " VALUES (:task, 'default', CAST(:args AS jsonb), 'available', now(), now()) RETURNING id"
)

# Pending tasks, counted on the two partial indexes that hold them (available, running).
PENDING = (
    "SELECT (SELECT count(*) FROM oncely_tasks WHERE state = 'available')"
    " + (SELECT count(*) FROM oncely_tasks WHERE state = 'running')"
)


KEYS = 8
"""The keyed drain's concurrency keys (concurrency=1 each)."""
RATE = "1000000/s"
"""The rated drain's rate: far above any drain here, so it measures the limit's cost."""


class Oncely(System):
    name = "oncely"
    drains = ("noop", "one_row", "one_row_driver", "keyed", "rated")
    group = 1
    """The worker's `group` (--group): with a backlog, up to this many tasks per transaction."""
    pool_size = 0
    """The worker's pool (--pool-size); 0: oncely's default."""

    async def setup(self, dsn: str) -> None:
        import sqlalchemy as sa
        from sqlalchemy.ext.asyncio import AsyncSession

        from oncely import Oncely as App
        from oncely import asyncpg_connection

        self.dsn = dsn
        self.app = App(dsn)
        await self.app.migrate()
        self.started = {}
        self.session = AsyncSession
        insert = sa.text("INSERT INTO bench_effects (n) VALUES (:n)")
        started = self.started

        @self.app.task
        async def noop(db, n: int) -> None:  # type: ignore[no-untyped-def]
            started.setdefault(n, time.perf_counter())

        @self.app.task
        async def one_row(db, n: int) -> None:  # type: ignore[no-untyped-def]
            await db.execute(insert, {"n": n})

        @self.app.task
        async def one_row_driver(db, n: int) -> None:  # type: ignore[no-untyped-def]
            conn = await asyncpg_connection(db)  # in the task's transaction, as above
            await conn.execute("INSERT INTO bench_effects (n) VALUES ($1)", n)

        # one_row with limits: at most one at a time per key, over KEYS keys; and a rate that
        # the drain does not reach (what its bookkeeping costs, not how it paces).
        @self.app.task(concurrency=1, concurrency_key=lambda n: f"k{n % KEYS}")
        async def keyed(db, n: int) -> None:  # type: ignore[no-untyped-def]
            await db.execute(insert, {"n": n})

        @self.app.task(rate=RATE)
        async def rated(db, n: int) -> None:  # type: ignore[no-untyped-def]
            await db.execute(insert, {"n": n})

        self.tasks = {
            "noop": noop,
            "one_row": one_row,
            "one_row_driver": one_row_driver,
            "keyed": keyed,
            "rated": rated,
        }
        self.floor_insert = sa.text(FLOOR_INSERT_SQL)
        self.held: Any = None
        self.auto: Any = None
        self.raw = await asyncpg.connect(dsn)

    async def reset(self) -> None:
        for held in (self.held, self.auto):
            if held is not None:
                await held.close()
        self.held = self.auto = None
        conn = await asyncpg.connect(self.dsn)
        await conn.execute("TRUNCATE oncely_tasks, oncely_task_starts, bench_effects")
        await conn.close()

    async def enqueue_one(self, task: str, n: int) -> None:
        await self.enqueue_sent(task, n)

    async def enqueue_sent(self, task: str, n: int) -> float:
        # One transaction per task on a held session (the peers hold a connection too).
        if self.held is None:
            self.held = self.session(self.app.store.engine)
        async with self.held.begin():
            await self.tasks[task].enqueue(self.held, n=n)
            sent = time.perf_counter()  # what remains is the COMMIT
        return sent

    async def enqueue_in(self, task: str, n: int, transaction: bool) -> None:
        if transaction:
            await self.enqueue_one(task, n)
            return
        if self.auto is None:  # a held session in autocommit mode: the INSERT commits itself
            engine = self.app.store.engine.execution_options(isolation_level="AUTOCOMMIT")
            self.auto = self.session(engine)
        await self.tasks[task].enqueue(self.auto, n=n)

    async def enqueue_batch(self, task: str, ns: list[int]) -> None:
        async with self.session(self.app.store.engine) as db, db.begin():
            await self.tasks[task].enqueue_many(db, [{"n": n} for n in ns])

    driver_enqueue = True

    async def enqueue_in_driver(self, task: str, n: int, transaction: bool) -> None:
        # On a held asyncpg connection, as pgqueuer's driver holds one.
        if transaction:
            async with self.raw.transaction():
                await self.tasks[task].enqueue(self.raw, n=n)
        else:
            await self.tasks[task].enqueue(self.raw, n=n)

    async def enqueue_batch_driver(self, task: str, ns: list[int]) -> None:
        async with self.raw.transaction():
            await self.tasks[task].enqueue_many(self.raw, [{"n": n} for n in ns])

    async def enqueue_floor(self, task: str, n: int, transaction: bool) -> None:
        # SQLAlchemy alone, no oncely code: one INSERT of a task row as text, on the same held
        # sessions as `enqueue_in` (in a transaction of its own, or autocommitted). No enqueue
        # that runs on an AsyncSession can be faster.
        params = {"task": task, "args": json.dumps({"n": n})}
        if not transaction:
            if self.auto is None:
                engine = self.app.store.engine.execution_options(isolation_level="AUTOCOMMIT")
                self.auto = self.session(engine)
            await self.auto.execute(self.floor_insert, params)
            return
        if self.held is None:
            self.held = self.session(self.app.store.engine)
        async with self.held.begin():
            await self.held.execute(self.floor_insert, params)

    def shapes(self, concurrency: int) -> list[str]:
        # Its pool (whatever the concurrency), its control connection, its LISTEN and the
        # app's engine.
        from oncely.config import POOL_SIZE

        return [""] if self.room >= (self.pool_size or POOL_SIZE) + 3 else []

    async def drain(self, total: int, concurrency: int, shape: str) -> None:
        from oncely.queue import consume

        stopping = asyncio.Event()
        options: dict[str, int] = {"group": self.group} if self.group > 1 else {}
        if self.pool_size:
            options["pool_size"] = self.pool_size
        worker = asyncio.create_task(
            consume(self.app, stopping, concurrency=concurrency, **options)
        )
        await wait_empty(self.dsn, PENDING)
        stopping.set()
        await worker

    async def start_idle_worker(self) -> Callable[[], Awaitable[None]]:
        from oncely.queue import consume

        stopping = asyncio.Event()
        worker = asyncio.create_task(consume(self.app, stopping, concurrency=10))

        async def stop() -> None:
            stopping.set()
            await worker

        return stop

    async def close(self) -> None:
        await self.reset()
        await self.app.aclose()


# -- procrastinate ------------------------------------------------------------------------


class Procrastinate(System):
    name = "procrastinate"
    connector_size = 40  # its connector's pool: its worker fetches and finishes jobs on it

    async def setup(self, dsn: str) -> None:
        import procrastinate

        self.dsn = dsn
        self.pool = await asyncpg.create_pool(dsn, min_size=2, max_size=20)
        self.app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(conninfo=dsn, max_size=self.connector_size)
        )
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()
        self.started = {}
        started, pool = self.started, self.pool

        @self.app.task(name="noop")
        async def noop(n: int) -> None:
            started.setdefault(n, time.perf_counter())

        @self.app.task(name="one_row")
        async def one_row(n: int) -> None:
            await pool.execute("INSERT INTO bench_effects (n) VALUES ($1)", n)

        @self.app.task(name="one_row_driver")  # the same task: it is on the driver already
        async def one_row_driver(n: int) -> None:
            await pool.execute("INSERT INTO bench_effects (n) VALUES ($1)", n)

        self.tasks = {"noop": noop, "one_row": one_row, "one_row_driver": one_row_driver}

    async def reset(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        await conn.execute(
            "TRUNCATE procrastinate_jobs, procrastinate_events, bench_effects CASCADE"
        )
        await conn.close()

    async def enqueue_one(self, task: str, n: int) -> None:
        await self.tasks[task].defer_async(n=n)

    async def enqueue_batch(self, task: str, ns: list[int]) -> None:
        await self.tasks[task].batch_defer_async(*[{"n": n} for n in ns])

    def shapes(self, concurrency: int) -> list[str]:
        return [""] if concurrency <= self.room - 20 else []

    async def drain(self, total: int, concurrency: int, shape: str) -> None:
        await self.app.run_worker_async(
            concurrency=concurrency, wait=False, install_signal_handlers=False
        )
        await wait_empty(
            self.dsn, "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        )

    async def start_idle_worker(self) -> Callable[[], Awaitable[None]]:
        worker = asyncio.create_task(
            self.app.run_worker_async(concurrency=10, install_signal_handlers=False)
        )
        await asyncio.sleep(0.5)

        async def stop() -> None:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)

        return stop

    async def close(self) -> None:
        await self.app.close_async()
        await self.pool.close()


# -- pgqueuer -----------------------------------------------------------------------------


class PgQueuer(System):
    name = "pgqueuer"
    BATCH = 10  # its default dequeue batch size

    async def setup(self, dsn: str) -> None:
        from pgqueuer import AsyncpgDriver, Queries

        self.dsn = dsn
        self.conn = await asyncpg.connect(dsn)
        self.queries = Queries(AsyncpgDriver(self.conn))
        await self.queries.install()
        self.pool = await asyncpg.create_pool(dsn, min_size=2, max_size=20)
        self.started = {}

    def _manager(self, conn: asyncpg.Connection) -> Any:
        from pgqueuer import AsyncpgDriver, Queries, QueueManager

        qm = QueueManager(Queries(AsyncpgDriver(conn)))
        started, pool = self.started, self.pool

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            started.setdefault(json.loads(job.payload)["n"], time.perf_counter())

        @qm.entrypoint("one_row")
        async def one_row(job: Any) -> None:
            await pool.execute(
                "INSERT INTO bench_effects (n) VALUES ($1)", json.loads(job.payload)["n"]
            )

        @qm.entrypoint("one_row_driver")  # the same job: it is on the driver already
        async def one_row_driver(job: Any) -> None:
            await pool.execute(
                "INSERT INTO bench_effects (n) VALUES ($1)", json.loads(job.payload)["n"]
            )

        return qm

    async def reset(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, bench_effects")
        await conn.close()

    async def enqueue_one(self, task: str, n: int) -> None:
        await self.queries.enqueue(task, json.dumps({"n": n}).encode())

    async def enqueue_in(self, task: str, n: int, transaction: bool) -> None:
        if not transaction:
            await self.enqueue_one(task, n)
            return
        async with self.conn.transaction():  # its driver runs on this connection
            await self.queries.enqueue(task, json.dumps({"n": n}).encode())

    async def enqueue_batch(self, task: str, ns: list[int]) -> None:
        await self.queries.enqueue(
            [task] * len(ns), [json.dumps({"n": n}).encode() for n in ns], [0] * len(ns)
        )

    def shapes(self, concurrency: int) -> list[str]:
        # Its two ways to run N jobs at once: one QueueManager that dequeues N per batch (it
        # runs a batch's jobs concurrently and logs their completions in batches of N), and N
        # managers (a connection each) with its default batch of 10, as its benchmark tool does.
        shapes = [f"1 manager, batch {concurrency}"]
        if concurrency + 20 <= self.room:
            many = "managers" if concurrency > 1 else "manager"
            shapes.append(f"{concurrency} {many}, batch {self.BATCH}")
        return shapes

    async def drain(self, total: int, concurrency: int, shape: str) -> None:
        from datetime import timedelta

        from pgqueuer.types import QueueExecutionMode

        count, _, batch = shape.partition(" manager")
        managers, size = int(count), int(batch.rpartition(" ")[2])
        conns = [await asyncpg.connect(self.dsn) for _ in range(managers)]
        qms = [self._manager(c) for c in conns]
        await asyncio.gather(
            *(
                qm.run(
                    mode=QueueExecutionMode.drain,
                    batch_size=size,
                    dequeue_timeout=timedelta(seconds=0.5),
                )
                for qm in qms
            )
        )
        for conn in conns:
            await conn.close()

    async def start_idle_worker(self) -> Callable[[], Awaitable[None]]:
        conn = await asyncpg.connect(self.dsn)
        qm = self._manager(conn)
        worker = asyncio.create_task(qm.run(batch_size=self.BATCH))
        await asyncio.sleep(0.5)

        async def stop() -> None:
            qm.shutdown.set()
            await asyncio.gather(worker, return_exceptions=True)
            await conn.close()

        return stop

    async def close(self) -> None:
        await self.conn.close()
        await self.pool.close()


# -- measurements -------------------------------------------------------------------------


async def enqueue_single(
    system: System, count: int, transaction: bool, driver: bool = False, floor: bool = False
) -> float:
    await system.reset()
    enqueue = system.enqueue_in_driver if driver else system.enqueue_in
    if floor:
        enqueue = system.enqueue_floor
    started = time.perf_counter()
    for n in range(count):
        await enqueue("noop", n, transaction)
    return count / (time.perf_counter() - started)


async def enqueue_batch(
    system: System, count: int, size: int = 1000, driver: bool = False
) -> float:
    await system.reset()
    enqueue = system.enqueue_batch_driver if driver else system.enqueue_batch
    started = time.perf_counter()
    for start in range(0, count, size):
        await enqueue("noop", list(range(start, min(count, start + size))))
    return count / (time.perf_counter() - started)


async def drain(system: System, task: str, count: int, concurrency: int, shape: str) -> float:
    await system.reset()
    for start in range(0, count, 1000):
        await system.enqueue_batch(task, list(range(start, min(count, start + 1000))))
    started = time.perf_counter()
    await system.drain(count, concurrency, shape)
    return count / (time.perf_counter() - started)


async def latency(system: System, samples: int) -> tuple[float, float]:
    await system.reset()
    system.started.clear()
    stop = await system.start_idle_worker()
    delays = []
    try:
        for i in range(samples):
            n = 10_000_000 + i
            # From the commit's send, not its return: the server tells listeners of a commit
            # before it answers the committer, so on a busy machine a task can start before
            # the committing client hears its COMMIT return.
            enqueued = await system.enqueue_sent("noop", n)
            deadline = enqueued + 10
            while n not in system.started:
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"{system.name}: task {n} never started")
                await asyncio.sleep(0)
            delays.append((system.started[n] - enqueued) * 1000)
            await asyncio.sleep(0.005)
    finally:
        await stop()
    quantiles = statistics.quantiles(delays, n=100)
    return statistics.median(delays), quantiles[98]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--single", type=int, default=2_000, help="single enqueues to time")
    parser.add_argument("--concurrency", default="1,10,50,100")
    parser.add_argument("--samples", type=int, default=200, help="latency samples")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--procrastinate-tasks",
        type=int,
        default=5_000,
        help="tasks per procrastinate drain (it drains one job per round trip: minutes at 20k)",
    )
    parser.add_argument("--systems", default="oncely,pgqueuer,procrastinate")
    parser.add_argument(
        "--database-prefix", default="bench_queue", help="each system's database: PREFIX_NAME"
    )
    parser.add_argument("--only-latency", action="store_true", help="skip enqueue and drains")
    parser.add_argument(
        "--drains",
        default="noop,one_row,one_row_driver,keyed,rated",
        help='which drains to time ("" for none; keyed and rated: oncely only)',
    )
    parser.add_argument("--no-enqueue", action="store_true", help="skip the enqueue rows")
    parser.add_argument(
        "--keep-databases",
        action="store_true",
        help="leave each system's database behind at the end (to look at its tables)",
    )
    parser.add_argument("--no-latency", action="store_true", help="skip the latency rows")
    parser.add_argument(
        "--group",
        type=int,
        default=1,
        help="oncely's worker runs up to this many tasks of a backlog in one transaction, a"
        " savepoint each (`oncely worker --group`; 1: each task in its own)",
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        default=0,
        help="oncely's worker pool (`oncely worker --pool-size`; 0: its default, 10); the"
        " peers' tasks insert on a pool of 20",
    )
    parser.add_argument(
        "--no-fsync",
        action="store_true",
        help="every system's database commits without waiting for the disk (synchronous_commit"
        " = off, a session may still turn it on) so round trips and CPU dominate, not a shared"
        " disk",
    )
    args = parser.parse_args()
    Oncely.group = args.group
    Oncely.pool_size = args.pool_size
    base = args.database_url.replace("postgresql+asyncpg://", "postgresql://")
    classes = {"oncely": Oncely, "procrastinate": Procrastinate, "pgqueuer": PgQueuer}
    systems: list[System] = []
    created: list[str] = []
    try:
        for name in args.systems.split(","):
            system = classes[name]()
            database = f"{args.database_prefix}_{name}"
            created.append(database)
            dsn = await fresh_database(base, database, not args.no_fsync)
            await system.setup(dsn)
            systems.append(system)
        room = await connection_room(base)
        for system in systems:
            system.room = room
        concurrencies = [int(c) for c in args.concurrency.split(",")]
        results: dict[str, dict[str, float]] = {s.name: {} for s in systems}
        shapes: dict[tuple[str, str], str] = {}

        def keep(
            system: System, metric: str, value: float, best: Callable[..., float], shape: str = ""
        ) -> None:
            old = results[system.name].get(metric)
            results[system.name][metric] = value if old is None else best(old, value)
            if results[system.name][metric] == value and shape:
                shapes[system.name, metric] = shape
            print(f"  {system.name:14} {metric:28} {value:10.1f}  {shape}", flush=True)

        for round_no in range(args.rounds):
            print(f"round {round_no + 1}/{args.rounds}", flush=True)
            for system in systems:
                if args.only_latency or args.no_enqueue:
                    break
                rate = await enqueue_single(system, args.single, transaction=True)
                keep(system, "enqueue single, own transaction /s", rate, max)
                rate = await enqueue_single(system, args.single, transaction=False)
                keep(system, "enqueue single, autocommit /s", rate, max)
                keep(system, "enqueue batch /s", await enqueue_batch(system, args.tasks), max)
                if system.driver_enqueue:
                    rate = await enqueue_single(system, args.single, transaction=True, driver=True)
                    keep(system, f"enqueue single, own transaction{ASYNCPG} /s", rate, max)
                    rate = await enqueue_single(system, args.single, transaction=False, driver=True)
                    keep(system, f"enqueue single, autocommit{ASYNCPG} /s", rate, max)
                    rate = await enqueue_batch(system, args.tasks, driver=True)
                    keep(system, f"enqueue batch{ASYNCPG} /s", rate, max)
                    rate = await enqueue_single(system, args.single, transaction=True, floor=True)
                    keep(system, f"enqueue single, own transaction{ALONE} /s", rate, max)
                    rate = await enqueue_single(system, args.single, transaction=False, floor=True)
                    keep(system, f"enqueue single, autocommit{ALONE} /s", rate, max)
            for task in [t for t in args.drains.split(",") if t] if not args.only_latency else ():
                for concurrency in concurrencies:
                    for system in [s for s in systems if task in s.drains]:
                        count = (
                            args.procrastinate_tasks
                            if system.name == "procrastinate"
                            else args.tasks
                        )
                        for shape in system.shapes(concurrency):
                            rate = await drain(system, task, count, concurrency, shape)
                            keep(system, f"drain {task} c={concurrency} /s", rate, max, shape)
                            keep(
                                system,
                                f"drain {task} best /s",
                                rate,
                                max,
                                f"c={concurrency} {shape}",
                            )
            for system in systems if not args.no_latency else ():
                p50, p99 = await latency(system, args.samples)
                keep(system, "latency p50 ms", p50, min)
                keep(system, "latency p99 ms", p99, min)
        print_table(results, shapes, args)
    finally:
        try:
            for system in systems:
                await system.close()
        finally:
            if not args.keep_databases:
                await drop_databases(base, created)


async def connection_room(base: str) -> int:
    """How many more connections the server takes now, less a margin for everyone else."""
    conn = await asyncpg.connect(base)
    try:
        most = int(await conn.fetchval("SHOW max_connections"))
        used = int(await conn.fetchval("SELECT count(*) FROM pg_stat_activity"))
    finally:
        await conn.close()
    return most - used - 5


ASYNCPG = ", asyncpg connection"
"""The suffix of the enqueue rows where oncely enqueues on a bare asyncpg connection."""
ALONE = ", SQLAlchemy alone"
"""The suffix of the rows that run the same INSERT as text on oncely's AsyncSession, no
oncely code: the floor of an enqueue on an AsyncSession."""


def print_table(
    results: dict[str, dict[str, float]],
    shapes: dict[tuple[str, str], str],
    args: argparse.Namespace,
) -> None:
    names = list(results)
    order = []
    for metric in (
        "enqueue single, own transaction",
        "enqueue single, autocommit",
        "enqueue batch",
    ):
        order += [f"{metric} /s", f"{metric}{ASYNCPG} /s", f"{metric}{ALONE} /s"]
    for task in ("noop", "one_row", "one_row_driver", "keyed", "rated"):
        order += [f"drain {task} c={c} /s" for c in args.concurrency.split(",")]
        order.append(f"drain {task} best /s")
    order += ["latency p50 ms", "latency p99 ms"]
    metrics = [m for m in order if any(m in r for r in results.values())]
    print(
        f"\n{args.tasks} tasks per drain ({args.procrastinate_tasks} for procrastinate), "
        f"best of {args.rounds} rounds, {args.samples} latency samples\n"
    )
    header = "| metric | " + " | ".join(names) + " |"
    if "oncely" in names and "pgqueuer" in names:
        header += " oncely / pgqueuer |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for metric in metrics:
        cells = [f"{results[n][metric]:,.1f}" if metric in results[n] else "n/a" for n in names]
        row = f"| {metric} | " + " | ".join(cells) + " |"
        if "oncely" in names and "pgqueuer" in names:
            # pgqueuer enqueues on asyncpg in every row: its row is the peer of each of ours.
            peer = metric.replace(ASYNCPG, "").replace(ALONE, "")
            mine, theirs = results["oncely"].get(metric), results["pgqueuer"].get(peer)
            row += f" {mine / theirs:.2f} |" if mine and theirs else " n/a |"
        print(row)
    print("\nThe shape that gave each best drain:")
    for (name, metric), shape in shapes.items():
        if shape:
            print(f"- {name} {metric}: {shape}")


if __name__ == "__main__":
    asyncio.run(main())
