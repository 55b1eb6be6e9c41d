"""In-flight benchmark: many I/O-bound tasks at once on a few connections, oncely beside its peers.

    pip install -r bench/requirements.txt
    python bench/in_flight.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

Each task awaits `asyncio.sleep(--wait)` (a stand-in for an HTTP call), then inserts one row.
One worker per system drains --tasks of them at --concurrency tasks at once: oncely with a
pool of --pool-size connections (`oncely.queue.consume`, in this process), pgqueuer and
procrastinate as bench/queues.py drives them (their tasks insert on a pool of --pool-size
asyncpg connections). A thread samples pg_stat_activity every few milliseconds from a
connection to the admin database and keeps the peak number of connections to the system's
own database (the sampler and the bench's progress probe excluded). oncely also drains the
same tasks without the insert ("no database"): the sleep alone, which takes no connection;
and with the insert sent on the asyncpg connection its session lends it
(`oncely.asyncpg_connection`, in the task's transaction), as the peers' tasks send theirs.

The floor: the transaction each of oncely's one-row tasks commits, sent by pgbench (a C
client, no task system) on --pool-size connections, --tasks times, in the same run: `BEGIN;
SET LOCAL synchronous_commit TO on`, the row's INSERT, then the ack's UPDATE and COMMIT,
three round trips as oncely's worker sends them. It is what this server and machine allow a
transaction per task at that pool size (the sleep does not bound it: 1000 tasks sleeping
0.1 s at once are 10,000/s). Skipped, and said so, where no pgbench is installed.

Beside each drain's rate: the CPU time of this process per task (the worker, its sampler,
the enqueue) and of the whole machine per task (/proc/stat: the server's backends and WAL
writer too), so that what a task costs the machine shows, not only what it costs the client.

A peer's shape that needs more connections than the server has left is skipped, and the
output says so. Each system gets a fresh database of its own, dropped at the end. The
best of --rounds rounds is kept; the load average is printed with every drain (the machine
may be shared). Never a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import queues  # bench/queues.py: the systems and their helpers

PROBE = "oncely_bench_probe"
"""The application_name of the bench's own connections to a system's database: not counted."""

SLEEP_ROW = "sleep_row"
SLEEP = "sleep"
SLEEP_ROW_DRIVER = "sleep_row_driver"
DRIVER_ROW = "oncely, asyncpg_connection"

# -- the systems: bench/queues.py's, with the sleeping tasks ------------------------------


def probe_dsn(dsn: str) -> str:
    return f"{dsn}?application_name={PROBE}"


class Runs:
    """How many times each task body ran (every system's tasks record theirs here)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[int] = collections.Counter()


class Oncely(queues.Oncely):
    pool_size = 10
    wait = 0.1

    async def setup(self, dsn: str) -> None:
        import sqlalchemy as sa

        from oncely import asyncpg_connection

        await super().setup(dsn)
        await self.raw.close()  # queues.py's driver enqueues are not measured here
        insert = sa.text("INSERT INTO bench_effects (n) VALUES (:n)")
        self.runs = Runs()
        runs, bench = self.runs, self

        @self.app.task(name=SLEEP_ROW)
        async def sleep_row(db, n: int) -> None:  # type: ignore[no-untyped-def]
            runs.counts[n] += 1
            await asyncio.sleep(bench.wait)
            await db.execute(insert, {"n": n})

        @self.app.task(name=SLEEP_ROW_DRIVER)
        async def sleep_row_driver(db, n: int) -> None:  # type: ignore[no-untyped-def]
            runs.counts[n] += 1
            await asyncio.sleep(bench.wait)
            conn = await asyncpg_connection(db)
            await conn.execute("INSERT INTO bench_effects (n) VALUES ($1)", n)

        @self.app.task(name=SLEEP)
        async def sleep(db, n: int) -> None:  # type: ignore[no-untyped-def]
            runs.counts[n] += 1
            await asyncio.sleep(bench.wait)

        self.tasks.update({SLEEP_ROW: sleep_row, SLEEP_ROW_DRIVER: sleep_row_driver, SLEEP: sleep})

    def needs(self, concurrency: int, shape: str) -> int:
        # Its pool, its control connection, its LISTEN, the app's engine (schema check).
        return self.pool_size + 3

    async def before_drain(self) -> None:
        # The enqueue's pooled connection is the bench's, not the worker's: close it, so
        # that what the sampler sees during the drain is what a worker process holds.
        await self.app.store.engine.dispose()

    async def drain(self, total: int, concurrency: int, shape: str) -> None:
        from oncely.queue import consume

        stopping = asyncio.Event()
        worker = asyncio.create_task(
            consume(self.app, stopping, concurrency=concurrency, pool_size=self.pool_size)
        )
        try:
            await queues.wait_empty(probe_dsn(self.dsn), queues.PENDING)
        finally:
            stopping.set()
            await worker


class PgQueuer(queues.PgQueuer):
    pool_size = 10
    wait = 0.1

    async def setup(self, dsn: str) -> None:
        await super().setup(dsn)
        await self.pool.close()
        self.pool = await asyncpg.create_pool(dsn, min_size=2, max_size=self.pool_size)
        self.runs = Runs()

    def _manager(self, conn: asyncpg.Connection) -> Any:
        qm = super()._manager(conn)
        runs, bench = self.runs, self

        @qm.entrypoint(SLEEP_ROW)
        async def sleep_row(job: Any) -> None:
            n = json.loads(job.payload)["n"]
            runs.counts[n] += 1
            await asyncio.sleep(bench.wait)
            await bench.pool.execute("INSERT INTO bench_effects (n) VALUES ($1)", n)

        return qm

    def needs(self, concurrency: int, shape: str) -> int:
        # Its managers' connections, its enqueue connection, the tasks' pool.
        managers = int(shape.partition(" manager")[0])
        return managers + 1 + self.pool_size

    async def before_drain(self) -> None: ...


class Procrastinate(queues.Procrastinate):
    pool_size = 10
    wait = 0.1
    connector_size = 20  # its connector's pool (set to --pool-size): the tasks' pool's size

    async def setup(self, dsn: str) -> None:
        await super().setup(dsn)
        await self.pool.close()
        self.pool = await asyncpg.create_pool(dsn, min_size=2, max_size=self.pool_size)
        self.runs = Runs()
        runs, bench = self.runs, self

        @self.app.task(name=SLEEP_ROW)
        async def sleep_row(n: int) -> None:
            runs.counts[n] += 1
            await asyncio.sleep(bench.wait)
            await bench.pool.execute("INSERT INTO bench_effects (n) VALUES ($1)", n)

        self.tasks[SLEEP_ROW] = sleep_row

    def shapes(self, concurrency: int) -> list[str]:
        # Its connections are its connector's pool, not one per job: any concurrency fits.
        # It fetches one job per round trip, each of its job slots on its own, so a lower
        # concurrency (less contention on the pool) is measured too.
        return [f"concurrency {c}" for c in sorted({concurrency, min(concurrency, 100)})]

    def concurrency_of(self, shape: str, concurrency: int) -> int:
        return int(shape.rpartition(" ")[2])

    def needs(self, concurrency: int, shape: str) -> int:
        # Its connector's pool, its LISTEN connection, the tasks' pool.
        return self.connector_size + 1 + self.pool_size

    async def before_drain(self) -> None: ...

    async def drain(self, total: int, concurrency: int, shape: str) -> None:
        await self.app.run_worker_async(
            concurrency=self.concurrency_of(shape, concurrency),
            wait=False,
            install_signal_handlers=False,
        )
        await queues.wait_empty(
            probe_dsn(self.dsn),
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        )


CLASSES: dict[str, type[Any]] = {
    "oncely": Oncely,
    "pgqueuer": PgQueuer,
    "procrastinate": Procrastinate,
}

# -- measuring ---------------------------------------------------------------------------


class Sampler:
    """Counts the connections to one database from pg_stat_activity, every `every` seconds,
    in a thread of its own (so a busy event loop does not slow the sampling down)."""

    QUERY = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
        " AND pid <> pg_backend_pid() AND application_name IS DISTINCT FROM $2"
    )

    def __init__(self, admin_dsn: str, database: str, every: float = 0.003) -> None:
        self.admin_dsn, self.database, self.every = admin_dsn, database, every
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            asyncio.run(self._sample())
        except BaseException as exc:  # reported by __enter__/__exit__
            self._error = exc
            self._ready.set()

    async def _sample(self) -> None:
        conn = await asyncpg.connect(self.admin_dsn, server_settings={"application_name": PROBE})
        try:
            statement = await conn.prepare(self.QUERY)
            self._ready.set()
            while not self._stop.is_set():
                count = await statement.fetchval(self.database, PROBE)
                self.peak = max(self.peak, count)
                self.samples += 1
                await asyncio.sleep(self.every)
        finally:
            await conn.close()


@dataclasses.dataclass
class Drain:
    rate: float
    peak: int
    samples: int
    ran: int
    twice: int
    rows: int
    load: float
    cpu: float
    machine: float = 0.0
    """CPU ms per task of the whole machine (every process: the server's backends too)."""


async def drain(
    system: Any, task: str, count: int, concurrency: int, shape: str, base: str
) -> Drain:
    await system.reset()
    system.runs.counts.clear()
    for start in range(0, count, 1000):
        await system.enqueue_batch(task, list(range(start, min(count, start + 1000))))
    await system.before_drain()
    database = system.dsn.rpartition("/")[2]
    with Sampler(base, database) as sampler:
        cpu = time.process_time()
        busy = machine_busy()
        started = time.perf_counter()
        await system.drain(count, concurrency, shape)
        elapsed = time.perf_counter() - started
        busy = machine_busy() - busy
        cpu = time.process_time() - cpu
    conn = await asyncpg.connect(probe_dsn(system.dsn))
    try:
        rows = int(await conn.fetchval("SELECT count(DISTINCT n) FROM bench_effects"))
    finally:
        await conn.close()
    counts = system.runs.counts
    return Drain(
        rate=count / elapsed,
        peak=sampler.peak,
        samples=sampler.samples,
        ran=sum(counts.values()),
        twice=sum(1 for c in counts.values() if c > 1),
        rows=rows,
        load=os.getloadavg()[0],
        cpu=cpu * 1000 / count,
        machine=busy * 1000 / count,
    )


def machine_busy() -> float:
    """Seconds of CPU the whole machine spent busy so far, over all its cores (/proc/stat:
    user, nice, system, irq and softirq time, not the time the hypervisor gave to another
    guest; 0 where there is no /proc)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()[1:8]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields)
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


XACTS = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1"


async def idle_window(admin: asyncpg.Connection, database: str, seconds: float) -> str:
    """Transactions/s on `database`, CPU of this process and the connections held, over an
    idle window of `seconds` (the server's counters read a moment after, once flushed)."""
    await admin.execute("SELECT pg_stat_clear_snapshot()")
    before, cpu, started = await admin.fetchval(XACTS, database), time.process_time(), time.time()
    await asyncio.sleep(seconds)
    cpu, elapsed = time.process_time() - cpu, time.time() - started
    held = await admin.fetchval(Sampler.QUERY, database, PROBE)
    await asyncio.sleep(1.5)  # backends flush their counters at most once a second
    await admin.execute("SELECT pg_stat_clear_snapshot()")
    after = await admin.fetchval(XACTS, database)
    return (
        f"{(after - before) / elapsed:.2f} transactions/s, {cpu / elapsed * 100:.1f} % of a core,"
        f" {held} connections held"
    )


async def idle(system: Oncely, args: argparse.Namespace, base: str) -> list[str]:
    """An oncely worker idle, then busy with --tasks one-row tasks, then idle again."""
    from oncely.queue import consume

    await system.reset()
    await system.before_drain()
    database = system.dsn.rpartition("/")[2]
    admin = await asyncpg.connect(base, server_settings={"application_name": PROBE})
    stopping = asyncio.Event()
    worker = asyncio.create_task(
        consume(system.app, stopping, concurrency=args.concurrency, pool_size=args.pool_size)
    )
    try:
        await asyncio.sleep(12 if args.idle > 1 else 2)  # started, its counters flushed
        lines = [f"idle, never busy: {await idle_window(admin, database, args.idle)}"]
        for start in range(0, args.tasks, 1000):
            await system.enqueue_batch(SLEEP_ROW, list(range(start, min(args.tasks, start + 1000))))
        await system.before_drain()  # the enqueue's connection is the bench's
        await queues.wait_empty(probe_dsn(system.dsn), queues.PENDING)
        # A backend idle for 10 s flushes the counters of its last transactions: wait for
        # that, or the burst's tail would count as idle traffic.
        await asyncio.sleep(12 if args.idle > 1 else 2)
        lines.append(
            f"idle after {args.tasks} one-row tasks:"
            f" {await idle_window(admin, database, args.idle)}"
        )
    finally:
        stopping.set()
        await worker
        await admin.close()
    return lines


FLOOR_SCRIPT = """\\set id random(1, :tasks)
BEGIN \\; SET LOCAL synchronous_commit TO on;
INSERT INTO bench_effects (n) VALUES (:id);
UPDATE bench_acks SET state = 'succeeded' WHERE id = :id AND token = 'token' \\; COMMIT;
"""
"""One task's transaction in pgbench's script language: three round trips (`\\;` joins two
statements into one message), the ack a compare-and-set on the task's id and token."""


def pgbench() -> str | None:
    """pgbench's path: on PATH, or where Debian's postgresql packages put it."""
    found = shutil.which("pgbench")
    if found:
        return found
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))
    return candidates[-1] if candidates else None


async def floor(base: str, database: str, tasks: int, clients: int) -> tuple[float, str]:
    """Transactions/s of FLOOR_SCRIPT from pgbench at `clients` connections, `tasks` in all,
    on a fresh database `database` (dropped by the caller); and pgbench's own line."""
    binary = pgbench()
    if binary is None:
        raise FileNotFoundError("pgbench")
    dsn = await queues.fresh_database(base, database)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE TABLE bench_acks (id bigint PRIMARY KEY, state text, token text);"
            " INSERT INTO bench_acks SELECT g, 'running', 'token'"
            f" FROM generate_series(1, {int(tasks)}) AS g"
        )
        await conn.execute("VACUUM ANALYZE bench_acks")
    finally:
        await conn.close()
    per_client = max(1, tasks // clients)
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(FLOOR_SCRIPT)
        script.flush()
        command = [
            binary, "--no-vacuum", "--protocol=simple", f"--client={clients}",
            f"--jobs={min(clients, os.cpu_count() or 1)}", f"--transactions={per_client}",
            f"--define=tasks={int(tasks)}", f"--file={script.name}", dsn,
        ]  # fmt: skip
        done = await asyncio.to_thread(
            subprocess.run, command, capture_output=True, text=True, timeout=600
        )
    found = re.search(r"^tps = ([0-9.]+)", done.stdout, re.MULTILINE)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"pgbench failed: {done.stderr.strip()[-500:]}")
    return float(found.group(1)), f"{clients * per_client} transactions on {clients} connections"


FLOOR = "floor: pgbench, the same transaction"


async def add_floor(
    args: argparse.Namespace,
    base: str,
    databases: list[str],
    results: dict[tuple[str, str], Drain],
    shapes: dict[tuple[str, str], str],
) -> str | None:
    """Measure the floor into `results` (unless --no-floor); a line saying why it was not."""
    if args.no_floor:
        return None
    database = f"{args.database_prefix}_floor"
    databases.append(database)
    try:
        busy = machine_busy()
        rate, how = await floor(base, database, args.tasks, args.pool_size)
        busy = machine_busy() - busy
    except FileNotFoundError:
        print("  floor skipped: no pgbench is installed", flush=True)
        return "floor skipped: no pgbench is installed"
    load_now = os.getloadavg()[0]
    # The machine's CPU over pgbench's whole run (its setup of a second or so included).
    machine = busy * 1000 / args.tasks
    results[FLOOR, ""] = Drain(rate, args.pool_size, 0, 0, 0, 0, load_now, 0.0, machine)
    shapes[FLOOR, ""] = how
    print(f"  {'floor (pgbench)':22} {rate:9,.1f} transactions/s  {how}", flush=True)
    return None


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--database-prefix", default="bench_in_flight", help="each system's database: PREFIX_NAME"
    )
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument(
        "--procrastinate-tasks",
        type=int,
        default=1_000,
        help="tasks per procrastinate drain (it ran at 20-100 tasks/s here: minutes at 10k)",
    )
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--wait", type=float, default=0.1, help="each task's sleep, in seconds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--systems", default="oncely,pgqueuer,procrastinate")
    parser.add_argument(
        "--idle",
        type=float,
        default=0,
        metavar="SECONDS",
        help="also measure an idle oncely worker for SECONDS, before and after a burst",
    )
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="leave out the floor (pgbench, the same transaction)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (CI): 200 tasks, 50 at once, pool 4"
    )
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.concurrency, args.pool_size, args.wait, args.rounds = 200, 50, 4, 0.02, 1
        args.procrastinate_tasks, args.idle = 100, min(args.idle, 1)
    systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in CLASSES]
    if unknown or not systems:
        parser.error(
            f"--systems: unknown {', '.join(unknown) or '(none)'}; known: {', '.join(CLASSES)}"
        )
    for flag in ("tasks", "procrastinate_tasks", "concurrency", "pool_size", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.wait < 0:
        parser.error("--wait must not be negative")
    if args.idle < 0:
        parser.error("--idle must not be negative")
    args.systems = systems
    return args


def plan_drains(
    systems: list[Any], args: argparse.Namespace, room: int
) -> tuple[list[tuple[Any, str, str, str]], list[str]]:
    """The drains to run (system, row, task, shape) and the shapes left out, and why."""
    skipped: list[str] = []
    plan: list[tuple[Any, str, str, str]] = []  # system, row, task, shape
    for system in systems:
        system.room = room
        for shape in system.shapes(args.concurrency) if system.name != "oncely" else [""]:
            if system.needs(args.concurrency, shape) > room:
                skipped.append(
                    f"{system.name} ({shape}): needs {system.needs(args.concurrency, shape)}"
                    f" connections, the server has {room} left"
                )
                continue
            plan.append((system, system.name, SLEEP_ROW, shape))
        many = f"{args.concurrency} managers, batch {queues.PgQueuer.BATCH}"
        if system.name == "pgqueuer" and many not in system.shapes(args.concurrency):
            skipped.append(
                f"pgqueuer ({many}): needs"
                f" {args.concurrency + 1 + args.pool_size} connections, the server has"
                f" {room} left"
            )
        if system.name == "oncely":
            plan.append((system, DRIVER_ROW, SLEEP_ROW_DRIVER, ""))
            plan.append((system, "oncely, no database", SLEEP, ""))
    return plan, skipped


async def main() -> None:
    args = parse()
    base = args.database_url.replace("postgresql+asyncpg://", "postgresql://")
    print(f"load average at start: {load()}", flush=True)
    systems: list[Any] = []
    databases: list[str] = []
    try:
        for name in args.systems:
            system = CLASSES[name]()
            system.pool_size, system.wait = args.pool_size, args.wait
            system.connector_size = args.pool_size
            database = f"{args.database_prefix}_{name}"
            databases.append(database)
            await system.setup(await queues.fresh_database(base, database))
            systems.append(system)
        room = await queues.connection_room(base)
        print(f"connections the server has left (less a margin of 5): {room}", flush=True)
        results: dict[tuple[str, str], Drain] = {}
        shapes: dict[tuple[str, str], str] = {}
        plan, skipped = plan_drains(systems, args, room)
        for line in skipped:
            print(f"skipped: {line}", flush=True)
        for round_no in range(args.rounds):
            print(f"round {round_no + 1}/{args.rounds}", flush=True)
            for system, row, task, shape in plan:
                count = args.procrastinate_tasks if system.name == "procrastinate" else args.tasks
                result = await drain(system, task, count, args.concurrency, shape, base)
                print(
                    f"  {row:22} {result.rate:9,.1f} tasks/s  peak {result.peak:3} connections"
                    f" ({result.samples} samples)  ran {result.ran} ({result.twice} twice)"
                    f"  rows {result.rows}  load {result.load:.2f}  {shape}",
                    flush=True,
                )
                old = results.get((row, ""))
                if old is None or result.rate > old.rate:
                    results[row, ""] = result
                    shapes[row, ""] = shape
                # Peak connections: the highest of the rounds (it is a bound, not a speed).
                results[row, ""].peak = max(results[row, ""].peak, result.peak)
        floor_line = await add_floor(args, base, databases, results, shapes)
        idle_lines = []
        if args.idle and systems[0].name == "oncely":
            idle_lines = await idle(systems[0], args, base)
    finally:
        for system in systems:
            await system.close()
        admin = await asyncpg.connect(base)
        try:
            for database in databases:
                await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await admin.close()
    print_table(args, results, shapes, skipped)
    if floor_line is not None:
        print(f"\n{floor_line}")
    for line in idle_lines:
        print(f"\noncely worker (concurrency {args.concurrency}, pool {args.pool_size}) {line}")


def print_table(
    args: argparse.Namespace,
    results: dict[tuple[str, str], Drain],
    shapes: dict[tuple[str, str], str],
    skipped: list[str],
) -> None:
    print(
        f"\n{args.tasks} tasks per drain ({args.procrastinate_tasks} for procrastinate),"
        f" each sleeping {args.wait} s then inserting one row;"
        f" concurrency {args.concurrency}, pool {args.pool_size}; best of {args.rounds}"
        f" rounds; load average at the end: {load()}\n"
    )
    mine = results.get(("oncely", ""))
    print(
        "| system | tasks/s | oncely / system | peak connections (any round) | ran (twice) | rows"
        " | bench process CPU ms / task | machine CPU ms / task | load | shape |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (row, _), result in results.items():
        theirs = row not in ("oncely, no database", DRIVER_ROW)
        ratio = f"{mine.rate / result.rate:.2f}" if mine and theirs else "n/a"
        if row == FLOOR:
            print(
                f"| {row} | {result.rate:,.1f} | {ratio} | {result.peak} | - | - | -"
                f" | {result.machine:.2f} | {result.load:.2f} | {shapes[row, '']} |"
            )
            continue
        print(
            f"| {row} | {result.rate:,.1f} | {ratio} | {result.peak} | {result.ran}"
            f" ({result.twice}) | {result.rows} | {result.cpu:.2f} | {result.machine:.2f}"
            f" | {result.load:.2f} | {shapes[row, ''] or '-'} |"
        )
    driver, peer = results.get((DRIVER_ROW, "")), results.get(("pgqueuer", ""))
    if driver and peer:
        print(f"\n{DRIVER_ROW} / pgqueuer: {driver.rate / peer.rate:.2f}")
    for line in skipped:
        print(f"\nskipped: {line}")


if __name__ == "__main__":
    asyncio.run(main())
