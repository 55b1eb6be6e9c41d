"""A one-row task's messages, by driver and shape: the floor under each worker shape, beside
pgqueuer's drain and oncely's worker in the same run.

    pip install -r bench/requirements.txt
    python bench/wire.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

Every shape drains the same --tasks one-row tasks of oncely's own table, enqueued by oncely,
leased in batches of --batch by one statement on a connection of its own and acked by
oncely's own `oncely_task_ack` (the function the worker calls). No worker code runs: only the
driver's calls, on --lanes connections, one task after another on each. So each shape's rate
is what its messages allow on this machine, above any worker that sends them:

- `asyncpg, alone`: `BEGIN; SET LOCAL synchronous_commit TO on`, the INSERT, `SELECT
  oncely_task_ack(…); COMMIT`: 3 round trips, a task alone in oncely's worker today.
- `asyncpg, group G`: per task, the INSERT and `SELECT oncely_task_ack(…); RELEASE SAVEPOINT
  …; SAVEPOINT …`, with one `BEGIN` and one `COMMIT` per G tasks: 2 round trips and a share,
  a grouped task today (`oncely worker --group G`).
- `psycopg, alone`: the same 3 messages on psycopg 3 (its cost per message against asyncpg's).
- `psycopg pipeline, alone`: the same statements in psycopg 3's pipeline mode, sent together
  and answered at one sync: 1 round trip a task, its ack still in its transaction.
- `psycopg pipeline, group G`: per task the INSERT, the ack, the savepoint's release and the
  next one's, together, one sync: 1 round trip a task and a share of the group's.
- `asyncpg, pgqueuer's messages`: the INSERT autocommitted, the acks of each lease batch in
  one statement once its tasks are done. Not oncely's guarantee (the ack is not in the task's
  transaction): the peer's messages on oncely's table, the floor of pgqueuer's shape.

Then, in the same run: pgqueuer's own one-row drain (its best of one manager with a batch of
--lanes and of --lanes managers of 10, as bench/queues.py runs it) and oncely's worker on the
one-row task that inserts on its driver's connection (`oncely.asyncpg_connection`), alone and
in groups of G. Beside each rate: its ratio to pgqueuer's drain, and the CPU per task of this
process and of the whole machine (the server's backends too). --rounds rounds, each system
and shape in turn; every round is printed, and the best of each kept. Never a test: numbers
depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import queues  # bench/queues.py: the systems and their helpers
from in_flight import machine_busy

from oncely.store.postgres_statements import GROUP_BEGIN, GROUP_NEXT, TASK_BEGIN, task_ack_sql

INSERT_ASYNCPG = "INSERT INTO bench_effects (n) VALUES ($1)"
INSERT_PSYCOPG = "INSERT INTO bench_effects (n) VALUES (%s)"
ACK_PSYCOPG = "SELECT oncely_task_ack(%s, %s)"
LEASE = (
    "UPDATE oncely_tasks SET state = 'running', attempt = attempt + 1, lease_token = $1,"
    " locked_by = 'wire', started_at = now(), lease_expires_at = now() + interval '10 minutes'"
    " WHERE id = ANY(ARRAY(SELECT id FROM oncely_tasks WHERE state = 'available'"
    " ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)) RETURNING id, (args ->> 'n')::bigint"
)
ACK_BATCH = (
    "UPDATE oncely_tasks SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL"
    " WHERE id = ANY($1::bigint[]) AND lease_token = $2 AND state = 'running'"
)
COUNTS = (
    "SELECT (SELECT count(DISTINCT n) FROM bench_effects),"
    " (SELECT count(*) FROM oncely_tasks WHERE state = 'succeeded')"
)

Item = tuple[int, int, str]
"""A leased task: its id, its argument n, its lease's token."""


async def leaser(
    dsn: str, work: asyncio.Queue[Item | None], total: int, batch: int, lanes: int
) -> None:
    """Lease `total` tasks, `batch` at a time, as fast as the lanes take them; then one None a
    lane (the end)."""
    conn = await asyncpg.connect(dsn)
    try:
        leased, number = 0, 0
        while leased < total:
            number += 1
            token = f"{secrets.token_hex(8)}.{number}"
            rows = await conn.fetch(LEASE, token, batch)
            if not rows:
                raise RuntimeError(f"leased {leased} of {total}: no task left")
            for task_id, n in rows:
                await work.put((task_id, n, token))
            leased += len(rows)
    finally:
        await conn.close()
    for _ in range(lanes):
        await work.put(None)


async def take(work: asyncio.Queue[Item | None], most: int) -> tuple[list[Item], bool]:
    """Up to `most` leased tasks (at least one unless the end came); whether the end came."""
    first = await work.get()
    if first is None:
        return [], True
    items = [first]
    while len(items) < most and not work.empty():
        item = work.get_nowait()
        if item is None:
            return items, True
        items.append(item)
    return items, False


Lane = Callable[[str, asyncio.Queue[Item | None], int], Awaitable[None]]


async def asyncpg_alone(dsn: str, work: asyncio.Queue[Item | None], group: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        while (item := await work.get()) is not None:
            task_id, n, token = item
            await conn.execute(TASK_BEGIN)
            await conn.execute(INSERT_ASYNCPG, n)
            await conn.execute(task_ack_sql(task_id, token, function=True))
    finally:
        await conn.close()


async def asyncpg_group(dsn: str, work: asyncio.Queue[Item | None], group: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        ended = False
        while not ended:
            items, ended = await take(work, group)
            if not items:
                break
            await conn.execute(GROUP_BEGIN)
            for task_id, n, token in items:
                await conn.execute(INSERT_ASYNCPG, n)
                await conn.execute(task_ack_sql(task_id, token, function=True, then=GROUP_NEXT))
            await conn.execute("COMMIT")
    finally:
        await conn.close()


async def _psycopg(dsn: str) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(dsn, autocommit=True)


async def psycopg_alone(dsn: str, work: asyncio.Queue[Item | None], group: int) -> None:
    conn = await _psycopg(dsn)
    try:
        while (item := await work.get()) is not None:
            task_id, n, token = item
            await conn.execute(TASK_BEGIN)
            await conn.execute(INSERT_PSYCOPG, (n,))
            await conn.execute(task_ack_sql(task_id, token, function=True))
    finally:
        await conn.close()


async def psycopg_pipeline_alone(dsn: str, work: asyncio.Queue[Item | None], group: int) -> None:
    conn = await _psycopg(dsn)
    try:
        async with conn.pipeline() as pipeline:
            while (item := await work.get()) is not None:
                task_id, n, token = item
                await conn.execute("BEGIN")
                await conn.execute("SET LOCAL synchronous_commit TO on")
                await conn.execute(INSERT_PSYCOPG, (n,))
                await conn.execute(ACK_PSYCOPG, (task_id, token))
                await conn.execute("COMMIT")
                await pipeline.sync()
    finally:
        await conn.close()


async def psycopg_pipeline_group(dsn: str, work: asyncio.Queue[Item | None], group: int) -> None:
    conn = await _psycopg(dsn)
    try:
        async with conn.pipeline() as pipeline:
            ended = False
            while not ended:
                items, ended = await take(work, group)
                if not items:
                    break
                await conn.execute("BEGIN")  # sent with the first task's statements
                await conn.execute("SET LOCAL synchronous_commit TO on")
                await conn.execute("SAVEPOINT oncely_task")
                for task_id, n, token in items:
                    await conn.execute(INSERT_PSYCOPG, (n,))
                    await conn.execute(ACK_PSYCOPG, (task_id, token))
                    await conn.execute("RELEASE SAVEPOINT oncely_task")
                    await conn.execute("SAVEPOINT oncely_task")
                    await pipeline.sync()
                await conn.execute("COMMIT")
                await pipeline.sync()
    finally:
        await conn.close()


def pgqueuer_messages(acks: asyncpg.Pool) -> Lane:
    """The INSERT autocommitted; each lease batch's acks in one statement when its tasks are done
    (pgqueuer logs its completions in batches)."""
    done: dict[str, list[int]] = {}
    pending: set[asyncio.Task[Any]] = set()

    async def lane(dsn: str, work: asyncio.Queue[Item | None], group: int) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            while (item := await work.get()) is not None:
                task_id, n, token = item
                await conn.execute(INSERT_ASYNCPG, n)
                ids = done.setdefault(token, [])
                ids.append(task_id)
                if len(ids) >= group:
                    del done[token]
                    ack = asyncio.ensure_future(acks.execute(ACK_BATCH, ids, token))
                    pending.add(ack)
                    ack.add_done_callback(pending.discard)
            for token in list(done):  # the rest, once: another lane may end meanwhile
                ids = done.pop(token, None)
                if ids:
                    await acks.execute(ACK_BATCH, ids, token)
            await asyncio.gather(*pending)
        finally:
            await conn.close()

    return lane


class Shapes(queues.Oncely):
    """oncely's table and tasks (set up, enqueued and reset as bench/queues.py does), drained by
    the driver's calls alone in one of the shapes above."""

    name = "shapes"
    batch = 50
    group = 20

    async def drain(self, total: int, concurrency: int, shape: str) -> None:
        lanes: dict[str, Lane] = {
            "asyncpg, alone": asyncpg_alone,
            "asyncpg, group": asyncpg_group,
            "psycopg, alone": psycopg_alone,
            "psycopg pipeline, alone": psycopg_pipeline_alone,
            "psycopg pipeline, group": psycopg_pipeline_group,
        }
        acks = None
        if shape == "asyncpg, pgqueuer's messages":
            acks = await asyncpg.create_pool(self.dsn, min_size=2, max_size=2)
            lane = pgqueuer_messages(acks)
            size = self.batch
        else:
            lane, size = lanes[shape], self.group
        work: asyncio.Queue[Item | None] = asyncio.Queue(maxsize=2 * self.batch)
        try:
            await asyncio.gather(
                leaser(self.dsn, work, total, self.batch, concurrency),
                *(lane(self.dsn, work, size) for _ in range(concurrency)),
            )
        finally:
            if acks is not None:
                await acks.close()

    async def counts(self) -> tuple[int, int]:
        conn = await asyncpg.connect(self.dsn)
        try:
            row = await conn.fetchrow(COUNTS)
        finally:
            await conn.close()
        return int(row[0]), int(row[1])


SHAPES = [
    ("asyncpg, alone", "3"),
    ("asyncpg, group", "2 + 2/G"),
    ("psycopg, alone", "3"),
    ("psycopg pipeline, alone", "1"),
    ("psycopg pipeline, group", "1 + 1/G"),
    ("asyncpg, pgqueuer's messages", "1 + 1/batch"),
]


Best = tuple[float, float, float, str]
"""A row's best drain: its rate, CPU ms per task of this process and of the machine, and where."""


def ways(system: queues.System, shape: str, lanes: int, group: int) -> list[tuple[str, str]]:
    """The drains of a row at `lanes`: (the task, the shape to pass the system)."""
    if isinstance(system, Shapes):
        return [("one_row", shape)]
    if isinstance(system, queues.Oncely):
        system.group = group if shape == "group" else 1
        return [("one_row_driver", "")]
    return [("one_row", how) for how in system.shapes(lanes)]  # pgqueuer: each of its shapes


async def measure(
    system: queues.System, task: str, total: int, lanes: int, shape: str
) -> tuple[float, float, float]:
    """One drain: its rate, and CPU ms per task of this process and of the machine."""
    cpu, busy = time.process_time(), machine_busy()
    rate = await queues.drain(system, task, total, lanes, shape)
    cpu, busy = time.process_time() - cpu, machine_busy() - busy
    return rate, cpu * 1000 / total, busy * 1000 / total


Row = tuple[str, str, Any, str]
"""A row of the table: its label, its round trips a task, its system, its shape."""


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument(
        "--lanes",
        default="10,50",
        help="connections draining at once (a list: each row at each, its best kept); oncely's"
        " worker runs that many tasks at once on its pool of 10, pgqueuer that many jobs",
    )
    parser.add_argument("--group", type=int, default=20, help="G: tasks per group transaction")
    parser.add_argument("--batch", type=int, default=50, help="tasks per lease")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--systems",
        default="shapes,pgqueuer,oncely",
        help="shapes: the driver's calls alone; pgqueuer and oncely: their own drains",
    )
    parser.add_argument("--database-prefix", default="bench_wire")
    args = parser.parse_args()
    try:
        args.lanes = [int(n) for n in args.lanes.split(",")]
    except ValueError:
        parser.error(f"--lanes: not a list of numbers: {args.lanes!r}")
    if args.tasks < 1 or min(args.lanes) < 1 or not 2 <= args.group <= 50 or args.batch < 1:
        parser.error("--tasks, --lanes and --batch must be at least 1, --group 2-50")
    args.systems = args.systems.split(",")
    unknown = set(args.systems) - {"shapes", "pgqueuer", "oncely"}
    if unknown:
        parser.error(f"no such system: {', '.join(sorted(unknown))}")
    return args


def table_rows(systems: dict[str, queues.System], group: int) -> list[Row]:
    rows: list[Row] = []
    if "shapes" in systems:
        for shape, trips in SHAPES:
            label = shape.replace("group", f"group {group}")
            rows.append((label, trips.replace("G", str(group)), systems["shapes"], shape))
    if "pgqueuer" in systems:
        rows.append(("pgqueuer drain", "", systems["pgqueuer"], ""))
    if "oncely" in systems:
        rows.append(("oncely worker, alone", "", systems["oncely"], "alone"))
        rows.append((f"oncely worker, group {group}", "", systems["oncely"], "group"))
    return rows


async def run_round(rows: list[Row], args: argparse.Namespace, best: dict[str, Best]) -> None:
    """Every row at every --lanes, once; each drain printed, each row's best kept."""
    for lanes in args.lanes:
        for label, _trips, system, shape in rows:
            for task, how in ways(system, shape, lanes, args.group):
                result = await measure(system, task, args.tasks, lanes, how)
                if isinstance(system, Shapes):
                    effects, acked = await system.counts()
                    if (effects, acked) != (args.tasks, args.tasks):
                        raise SystemExit(
                            f"{label}: {effects} effects and {acked} acks for {args.tasks} tasks"
                        )
                peer = system.name == "pgqueuer"
                said = f"{label} ({how})" if peer else label
                print(
                    f"  {said:44} {lanes:3} lanes {result[0]:9,.0f} tasks/s  CPU ms/task:"
                    f" this process {result[1]:.3f}, machine {result[2]:.3f}",
                    flush=True,
                )
                if label not in best or result[0] > best[label][0]:
                    best[label] = (*result, f"{lanes} lanes" + (f", {how}" if peer else ""))


async def main() -> None:
    args = parse()
    base = args.database_url.replace("postgresql+asyncpg://", "postgresql://")
    Shapes.batch, Shapes.group = args.batch, args.group
    kinds = {"shapes": Shapes, "pgqueuer": queues.PgQueuer, "oncely": queues.Oncely}
    systems: dict[str, queues.System] = {}
    created: list[str] = []
    try:
        for name in args.systems:
            system: queues.System = kinds[name]()
            database = f"{args.database_prefix}_{name}"
            created.append(database)
            await system.setup(await queues.fresh_database(base, database))
            systems[name] = system
        rows = table_rows(systems, args.group)
        best: dict[str, Best] = {}
        for number in range(1, args.rounds + 1):
            print(f"round {number} (load {os.getloadavg()[0]:.1f})", flush=True)
            await run_round(rows, args, best)
        print_table(rows, best, args)
    finally:
        for system in systems.values():
            await system.close()
        await queues.drop_databases(base, created)


def print_table(rows: list[Row], best: dict[str, Best], args: argparse.Namespace) -> None:
    peer = max((r[0] for label, r in best.items() if label.startswith("pgqueuer")), default=0.0)
    print()
    print(
        f"{args.tasks} one-row tasks, leases of {args.batch}, groups of {args.group}; each row's"
        f" best over {','.join(map(str, args.lanes))} lanes and {args.rounds} rounds"
    )
    print(
        "| shape | round trips a task | tasks/s | / pgqueuer's drain"
        " | this process CPU ms / task | machine CPU ms / task | best at |"
    )
    print("|---|--:|--:|--:|--:|--:|---|")
    for label, trips, _system, _shape in rows:
        rate, cpu, machine, where = best[label]
        ratio = f"{rate / peer:.2f}" if peer else "n/a"
        print(
            f"| {label} | {trips} | {rate:,.0f} | {ratio} | {cpu:.3f} | {machine:.3f} | {where} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
