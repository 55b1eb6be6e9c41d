"""How fast the dashboard's pages render on full tables: the issue's target is under 100 ms for
every page at 1,000,000 tasks and 100,000 slot claims on Postgres.

A Postgres database of its own, filled with set-based SQL (generate_series): --claims claims in
`oncely_runs` (100 hourly jobs, `job_0` … `job_99`, each with claims // 100 hourly slots back
from the last hour: bench/table_growth.py's fill), attempt records for a tenth of them
(failed, timed out), two suppressed duplicates for a fifth of them, --tasks tasks of 20
names in 4 queues (task_T in queue T % 4; each name in every state: 92 % succeeded, 3 %
available and due later, 2 % dead, 1 % discarded, 1 % running, 1 % available and due now; a
fifth with an idempotency key) and --audit audit rows, then VACUUM ANALYZE. Then each page
is requested --requests times through the dashboard's ASGI app in this process (httpx's
ASGITransport: the server's whole work, templates included, without the network) after one
warm-up request, and the table shows the median and p95 wall time,
the median CPU time of this process (the Python side: routing, reads' overhead, templates;
less moved by a busy machine than wall time), the statements one request runs and the
slowest statement of the page's requests (`--explain` prints EXPLAIN ANALYZE of each page's
slowest statement). The database is dropped at the end (--keep keeps it).

    python bench/web_pages.py                           # the full size: a few minutes
    python bench/web_pages.py --tasks 10000 --claims 2000 --requests 3    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import sqlalchemy as sa
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from table_growth import FILL_CLAIMS, JOBS  # noqa: E402

from oncely import Oncely, every  # noqa: E402
from oncely.web import dashboard  # noqa: E402

PG_URL = os.environ.get(
    "ONCELY_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TARGET_MS = 100.0
TIMELINE_JOB = "job_7"
TABLES = ("oncely_tasks", "oncely_runs", "oncely_attempts", "oncely_duplicates", "oncely_audit")
QUEUES = ["default", "mail", "media", "reports"]
NAMES = 20

FILL_TASKS = """
    INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at, created_at,
                              idempotency_key, locked_by, started_at, lease_expires_at,
                              finished_at, error)
    SELECT 'task_' || (i % 20), (ARRAY['default', 'mail', 'media', 'reports'])[1 + i % 20 % 4],
           jsonb_build_object('n', i, 'to', 'user' || i || '@example.com'), s.state,
           CASE s.state WHEN 'dead' THEN 25 WHEN 'available' THEN 0 ELSE 1 END,
           CASE WHEN i / 20 % 100 = 93 THEN now() - interval '1 min'
                WHEN s.state = 'available' THEN now() + make_interval(secs => 3600 + i % 86400)
                ELSE e.at - interval '2 s' END,
           e.at - interval '2 s',
           CASE WHEN i % 5 = 0 THEN 'key:' || i END,
           CASE WHEN s.state NOT IN ('available') THEN 'bench:fill' END,
           CASE WHEN s.state <> 'available' THEN e.at - interval '1 s' END,
           CASE WHEN s.state = 'running' THEN now() + interval '1 day' END,
           CASE WHEN s.state IN ('succeeded', 'dead', 'discarded') THEN e.at END,
           CASE WHEN s.state IN ('dead', 'discarded')
                THEN 'RuntimeError: the payment gateway said no' END
    FROM generate_series(1, $1::int) AS i,
         LATERAL (SELECT now() - make_interval(secs => ($1::int - i) * (90 * 86400.0 / $1::int))
                  AS at) AS e,
         LATERAL (SELECT CASE
                    WHEN i / 20 % 100 < 92 THEN 'succeeded'
                    WHEN i / 20 % 100 < 95 OR i / 20 % 100 = 99 THEN 'available'
                    WHEN i / 20 % 100 < 97 THEN 'dead'
                    WHEN i / 20 % 100 = 97 THEN 'discarded'
                    ELSE 'running' END AS state) AS s
"""
FILL_ATTEMPTS = """
    INSERT INTO oncely_attempts (job, key, slot, outcome, replica, host, pid, started_at,
                                 finished_at, recorded_at, error_class, error)
    SELECT r.job, r.key, r.scheduled_for, o.outcome, 'bench:fill', 'bench', 1,
           r.scheduled_for, r.scheduled_for + interval '1 s', r.scheduled_for + interval '1 s',
           CASE WHEN o.outcome = 'failed' THEN 'RuntimeError' END,
           CASE WHEN o.outcome = 'failed' THEN 'the upstream answered 503' END
    FROM (SELECT job, key, scheduled_for, row_number() OVER () AS n FROM oncely_runs) AS r,
         LATERAL (SELECT (ARRAY['failed', 'timeout'])[1 + r.n / 10 % 2] AS outcome) AS o
    WHERE r.n % 10 = 0
"""
FILL_DUPLICATES = """
    INSERT INTO oncely_duplicates (job, key, slot, replica, recorded_at)
    SELECT r.job, r.key, r.scheduled_for, 'replica-' || d, r.scheduled_for + interval '0.5 s'
    FROM (SELECT job, key, scheduled_for, row_number() OVER () AS n FROM oncely_runs) AS r,
         generate_series(1, 2) AS d
    WHERE r.n % 5 = 0
"""
FILL_AUDIT = """
    INSERT INTO oncely_audit (at, actor, action, job, target, reason, result)
    SELECT now() - make_interval(secs => ($1::int - i) * 60), 'ops' || (i % 5) || '@example.com',
           (ARRAY['pause', 'resume', 'backfill', 'task_retry'])[1 + i % 4], 'job_' || (i % 100),
           'job_' || (i % 100), 'bench fill', 'done'
    FROM generate_series(1, $1::int) AS i
"""


def build_app(url: str) -> Oncely:
    """The app whose tables are filled: 100 hourly jobs and the 20 task names."""
    app = Oncely(url)

    def noop_job(name: str) -> None:
        async def job(db: Any, now: datetime) -> None:
            return None

        app.job(every(hours=1), name=name)(job)

    def noop_task(name: str, queue: str) -> None:
        async def task(db: Any, n: int = 0, to: str = "") -> None:
            return None

        app.task(task, name=name, queue=queue)

    for j in range(JOBS):
        noop_job(f"job_{j}")
    for t in range(NAMES):
        noop_task(f"task_{t}", QUEUES[t % len(QUEUES)])
    return app


async def fill(raw: Any, tasks: int, claims: int, audit: int) -> dict[str, float]:
    """Fill the tables with set-based SQL; seconds per step."""
    took: dict[str, float] = {}
    per_job = max(1, claims // JOBS)
    for step, statement, args in (
        ("claims", FILL_CLAIMS, (JOBS, per_job, 3600.0)),  # hourly: what each job's page shows
        ("attempt records", FILL_ATTEMPTS, ()),
        ("duplicates", FILL_DUPLICATES, ()),
        ("tasks", FILL_TASKS, (tasks,)),
        ("audit rows", FILL_AUDIT, (audit,)),
    ):
        started = time.perf_counter()
        if not args or args[0]:
            await raw.execute(statement, *args)
        took[step] = time.perf_counter() - started
    started = time.perf_counter()
    for table in TABLES:
        await raw.execute(f"VACUUM ANALYZE {table}")
    took["vacuum analyze"] = time.perf_counter() - started
    await raw.execute("CHECKPOINT")
    return took


@dataclass
class Statements:
    """Every statement the app's engine runs while `watch`ing, with its time."""

    seen: list[tuple[float, str, Any]] = field(default_factory=list)
    on: bool = False

    def install(self, engine: sa.Engine) -> None:
        @sa.event.listens_for(engine, "before_cursor_execute")
        def before(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
            conn.info.setdefault("started", []).append(time.perf_counter())

        @sa.event.listens_for(engine, "after_cursor_execute")
        def after(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
            took = time.perf_counter() - conn.info["started"].pop()
            if self.on:
                self.seen.append((took, statement, params))

    @contextmanager
    def watch(self) -> Iterator[list[tuple[float, str, Any]]]:
        self.seen, self.on = [], True
        try:
            yield self.seen
        finally:
            self.on = False


@dataclass
class Timing:
    page: str
    ms: list[float]
    cpu_ms: list[float]
    status: int
    statements: int
    slowest: tuple[float, str, Any]

    @property
    def median(self) -> float:
        return statistics.median(self.ms)

    @property
    def p95(self) -> float:
        ordered = sorted(self.ms)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


async def pages(client: httpx.AsyncClient, raw: Any) -> list[str]:
    """The pages to time: every page, and the task listing under each kind of filter."""
    dead = await raw.fetchval("SELECT max(id) FROM oncely_tasks WHERE state = 'dead'")
    keyed = await raw.fetchval(
        "SELECT idempotency_key FROM oncely_tasks WHERE id <= $1 AND idempotency_key IS NOT NULL"
        " ORDER BY id DESC LIMIT 1",
        dead // 2,
    )
    listed = await client.get("/tasks")
    found = re.search(r'data-testid="next-page" href="[^"]*cursor=(\d+)"', listed.text)
    cursor = found.group(1) if found else "1"
    return [
        "/",
        f"/jobs/{TIMELINE_JOB}",
        f"/jobs/{TIMELINE_JOB}?n=500",
        "/tasks",
        f"/tasks?cursor={cursor}",
        "/tasks?state=available",
        "/tasks?state=running",
        "/tasks?state=dead",
        "/tasks?state=discarded",
        "/tasks?state=succeeded",
        "/tasks?queue=mail",
        "/tasks?task=task_3",
        "/tasks?state=dead&queue=mail&task=task_1",
        f"/tasks?key={keyed}",
        f"/tasks/{dead}",
        "/audit",
        "/audit?job=job_3",
        "/healthz",
    ]


async def time_page(
    client: httpx.AsyncClient, statements: Statements, page: str, requests: int
) -> Timing:
    warm = await client.get(page)
    ms: list[float] = []
    cpu_ms: list[float] = []
    slowest: tuple[float, str, Any] = (0.0, "", None)
    count = 0
    for _ in range(requests):
        with statements.watch() as seen:
            started, cpu = time.perf_counter(), time.process_time()
            answer = await client.get(page)
            ms.append((time.perf_counter() - started) * 1000)
            cpu_ms.append((time.process_time() - cpu) * 1000)
        count = len(seen)
        slowest = max([slowest, *seen], key=lambda s: s[0])
        if answer.status_code != warm.status_code:
            raise SystemExit(f"{page}: {answer.status_code} after {warm.status_code}")
    return Timing(page, ms, cpu_ms, warm.status_code, count, slowest)


def one_line(statement: str, width: int = 70) -> str:
    text = " ".join(statement.split())
    return text if len(text) <= width else text[: width - 1] + "…"


async def explain(raw: Any, timing: Timing) -> str:
    """EXPLAIN ANALYZE of a page's slowest statement, on asyncpg ($n parameters)."""
    _, statement, params = timing.slowest
    if not statement:
        return "(no statement)"
    values = list(params) if isinstance(params, (list, tuple)) else []
    try:
        rows = await raw.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", *values)
    except asyncpg.PostgresError as exc:
        return f"(cannot explain: {exc})"
    return "\n".join(r[0] for r in rows)


def report(timings: list[Timing], args: argparse.Namespace) -> None:
    print(
        "| page | status | median ms | p95 ms | CPU ms (median) | statements "
        f"| slowest statement ms | under {TARGET_MS:.0f} ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for t in timings:
        ok = "yes" if t.p95 < TARGET_MS else "**no**"
        print(
            f"| `{t.page}` | {t.status} | {t.median:.1f} | {t.p95:.1f} "
            f"| {statistics.median(t.cpu_ms):.1f} | {t.statements} "
            f"| {t.slowest[0] * 1000:.1f} | {ok} |"
        )
    worst = max(timings, key=lambda t: t.p95)
    print(
        f"\nslowest page: {worst.page} (p95 {worst.p95:.1f} ms; its slowest statement "
        f"{worst.slowest[0] * 1000:.1f} ms: {one_line(worst.slowest[1])})"
    )


async def main(args: argparse.Namespace) -> int:
    admin = await asyncpg.connect(PG_URL)
    database = f"oncely_webbench_{os.getpid()}"
    await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{database}"')
    url = make_url(PG_URL).set(drivername="postgresql", database=database)
    plain = url.render_as_string(hide_password=False)
    app = build_app(plain)
    raw = await asyncpg.connect(plain)
    try:
        await app.migrate()
        took = await fill(raw, args.tasks, args.claims, args.audit)
        sizes = {table: await raw.fetchval(f"SELECT count(*) FROM {table}") for table in TABLES}
        print(f"database: {database} on {make_url(PG_URL).render_as_string(hide_password=True)}")
        print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores")
        print("load average before the timings: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
        print("rows: " + ", ".join(f"{t} {n:,}" for t, n in sizes.items()))
        print("fill: " + ", ".join(f"{step} {s:.1f} s" for step, s in took.items()))
        statements = Statements()
        statements.install(app.store.engine.sync_engine)
        transport = httpx.ASGITransport(app=dashboard(app))
        timings = []
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            for page in await pages(client, raw):
                timings.append(await time_page(client, statements, page, args.requests))
        print(f"\n{args.requests} requests per page after one warm-up, in process (ASGI):\n")
        report(timings, args)
        if args.explain:
            for t in timings:
                print(
                    f"\n## {t.page}: {t.slowest[0] * 1000:.1f} ms\n{t.slowest[1]}\n{t.slowest[2]}"
                )
                print(await explain(raw, t))
    finally:
        await raw.close()
        await app.aclose()
        if not args.keep:
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()
    print(f"\ndatabase {database} {'kept' if args.keep else 'dropped'}")
    return 0


def positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=positive, default=1_000_000, help="tasks to fill")
    parser.add_argument("--claims", type=positive, default=100_000, help="slot claims to fill")
    parser.add_argument("--audit", type=positive, default=10_000, help="audit rows to fill")
    parser.add_argument("--requests", type=positive, default=20, help="timed requests per page")
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE slow statements")
    parser.add_argument("--keep", action="store_true", help="keep the filled database")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
