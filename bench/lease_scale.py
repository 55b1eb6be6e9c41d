"""Lease time against the queue's depth: a lease of 50 at 1,000 and at 1,000,000 due tasks.

    python bench/lease_scale.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

In a fresh database: a third of the tasks with a concurrency limit (8 keys, 1 each), the
priorities 0-2 spread over all of them. Each depth: 20 leases of 50 (each rolled back, so the
queue stays as it is), the median and the best printed, then the plan of one lease with the
rows each index scan read (EXPLAIN ANALYZE): a lease reads the batch it takes (and the
limited candidates it looks at), never the queue. Never a test: the times depend on the
machine; the rows read do not.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg
from sqlalchemy.dialects import postgresql

FILL = """
    INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, created_at,
                              priority, concurrency, concurrency_key)
    SELECT CASE WHEN g % 3 = 0 THEN 'keyed' ELSE 'plain' END, 'default', '{}', 'available', 0,
           now() - interval '1 hour', now(), g % 3, CASE WHEN g % 3 = 0 THEN 1 END,
           CASE WHEN g % 3 = 0 THEN 'k' || (g % 8) END
    FROM generate_series(1, $1) g
"""


def with_values(sql: str, params: dict[str, object]) -> str:
    """The lease statement with its parameters written in, for EXPLAIN (bench only)."""
    for name, value in params.items():
        text = "NULL" if value is None else repr(value)
        sql = sql.replace(f"%({name})s", text.replace('"', "'"))
    return sql


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--depths", default="1000,1000000")
    parser.add_argument("--database", default="bench_lease_scale")
    args = parser.parse_args()
    from oncely import Oncely

    base = args.database_url.rsplit("/", 1)[0]
    admin = await asyncpg.connect(args.database_url)
    await admin.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{args.database}"')
    app = Oncely(f"{base}/{args.database}")
    await app.migrate()
    raw = await asyncpg.connect(f"{base}/{args.database}")
    try:
        for depth in [int(d) for d in args.depths.split(",")]:
            await raw.execute("TRUNCATE oncely_tasks")
            await raw.execute(FILL, depth)
            await raw.execute("ANALYZE oncely_tasks")
            times = []
            async with app.store.engine.connect() as conn:
                for i in range(20):
                    started = time.perf_counter()
                    async with conn.begin() as tx:
                        got = await app.store.tasks.lease(conn, None, 50, f"t{i}", "bench", 30)
                        await tx.rollback()
                    times.append((time.perf_counter() - started) * 1000)
            print(
                f"{depth:>9,} due: lease of {len(got)}: median {statistics.median(times):.1f} ms,"
                f" best {min(times):.1f} ms"
            )
            stmt = app.store.tasks._fetch_statement(None, 30.0, None)
            compiled = stmt.compile(
                dialect=postgresql.dialect(), compile_kwargs={"render_postcompile": True}
            )
            params = dict(compiled.params, p_limit=50, p_scan=164, p_token="x", p_by="bench")
            explain = "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + with_values(
                str(compiled), params
            )
            tx = raw.transaction()
            await tx.start()
            try:  # EXPLAIN ANALYZE runs the lease: rolled back
                plan = await raw.fetch(explain)
            finally:
                await tx.rollback()
            for line in (r[0] for r in plan):
                if "Index Scan using oncely_tasks_next" in line:
                    print("   ", line.strip())
    finally:
        await raw.close()
        await app.aclose()
        await admin.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
