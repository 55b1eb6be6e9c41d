"""Soak: worker processes drain flaky tasks while one of them is SIGKILLed every few seconds.

Every task inserts one `effects` row in its own transaction and fails at random (10 % by
default) after writing. At the end every task must have succeeded and left exactly one effect:
none lost, none doubled, none stuck. The test suite runs a short form; the full one is

    python tests/apps/queue_soak.py --database-url postgresql://postgres@127.0.0.1/soak \
        --tasks 5000 --workers 3 --kill-every 3
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass
class SoakResult:
    tasks: int
    effects: Counter[int]
    states: dict[str, int]
    kills: int
    retries: int
    seconds: float

    @property
    def problems(self) -> list[str]:
        out = []
        missing = [n for n in range(self.tasks) if self.effects[n] == 0]
        doubled = [n for n, c in self.effects.items() if c > 1]
        if missing:
            out.append(f"{len(missing)} tasks left no effect, e.g. {missing[:5]}")
        if doubled:
            out.append(f"{len(doubled)} tasks took effect twice, e.g. {doubled[:5]}")
        if self.states != {"succeeded": self.tasks}:
            out.append(f"not all succeeded: {self.states}")
        return out


def sync_engine(url: str) -> sa.Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        return sa.create_engine(parsed.set(drivername="postgresql+psycopg2"))
    return sa.create_engine(parsed.set(drivername="sqlite"))


def _counts(engine: sa.Engine) -> tuple[dict[str, int], int]:
    with engine.connect() as conn:
        states = dict(
            conn.execute(sa.text("SELECT state, count(*) FROM oncely_tasks GROUP BY state")).all()
        )
        retries = conn.execute(
            sa.text("SELECT coalesce(sum(attempt), 0) - count(*) FROM oncely_tasks")
        ).scalar_one()
    return {k: int(v) for k, v in states.items()}, int(retries)


def soak(
    url: str,
    *,
    tasks: int = 5000,
    workers: int = 3,
    kill_every: float = 3.0,
    fail_rate: float = 0.1,
    lease: float = 2.0,
    concurrency: int = 4,
    timeout: float = 600.0,
    signals: Path | None = None,
) -> SoakResult:
    """Run the soak against a database that has oncely's tables (migrated) and nothing else."""
    from tests.apps.queue_app import EFFECTS_DDL, flaky

    engine = sync_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(EFFECTS_DDL)
    with Session(engine) as session, session.begin():
        for start in range(0, tasks, 1000):
            for n in range(start, min(tasks, start + 1000)):
                flaky.enqueue_sync(session, n=n)
    signal_dir = signals or Path(tempfile.mkdtemp(prefix="oncely-soak-"))
    env = {
        **os.environ,
        "ONCELY_DATABASE_URL": url,
        "ONCELY_TEST_SIGNALS": str(signal_dir),
        "ONCELY_TEST_FAIL_RATE": str(fail_rate),
    }
    command = [
        sys.executable,
        str(ROOT / "tests" / "apps" / "queue_worker.py"),
        "tests.apps.queue_app:app",
        "--concurrency",
        str(concurrency),
        "--lease",
        str(lease),
    ]

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    procs = [start() for _ in range(workers)]
    kills = 0
    started = time.monotonic()
    next_kill = started + kill_every
    rng = random.Random(os.getpid())
    try:
        while True:
            states, _ = _counts(engine)
            if states.get("succeeded", 0) + states.get("dead", 0) >= tasks:
                break
            if time.monotonic() - started > timeout:
                break
            if time.monotonic() >= next_kill:
                victim = rng.randrange(len(procs))
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait()
                procs[victim] = start()
                kills += 1
                next_kill = time.monotonic() + kill_every
            time.sleep(0.1)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    seconds = time.monotonic() - started
    with engine.connect() as conn:
        effects = Counter(n for (n,) in conn.execute(sa.text("SELECT n FROM effects")))
    states, retries = _counts(engine)
    engine.dispose()
    return SoakResult(tasks, effects, states, kills, retries, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=3.0)
    parser.add_argument("--fail-rate", type=float, default=0.1)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import asyncio

    from oncely import Oncely

    async def migrate() -> None:
        app = Oncely(args.database_url)
        await app.migrate()
        await app.aclose()

    asyncio.run(migrate())
    result = soak(
        args.database_url,
        tasks=args.tasks,
        workers=args.workers,
        kill_every=args.kill_every,
        fail_rate=args.fail_rate,
        lease=args.lease,
        concurrency=args.concurrency,
        timeout=args.timeout,
    )
    print(
        f"{result.tasks} tasks, {result.kills} SIGKILLs, {result.retries} retried attempts, "
        f"{result.seconds:.1f} s: states {result.states}"
    )
    for problem in result.problems:
        print("PROBLEM:", problem)
    print("OK: every effect exactly once" if not result.problems else "FAILED")
    sys.exit(1 if result.problems else 0)


if __name__ == "__main__":
    main()
