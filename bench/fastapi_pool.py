"""How many pool connections the worker in a FastAPI lifespan takes, and what it costs requests.

Writes the app of docs/how-to/fastapi.md (`shop_api.py`, as the guide shows it) to a temporary
directory, adds one endpoint that holds its request's transaction for 0.2 s (`SELECT
pg_sleep(0.2)`), and for each worker concurrency starts a real uvicorn on a fresh Postgres
database. It prints one JSON line per run: the most connections checked out of the app's
5 + 10 pool over 3 s while nothing is queued (`idle_checked_out`), and how long 20 concurrent
slow requests took (`slow_20_s`; 0.2 s if none waits for a connection).

    python bench/fastapi_pool.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import sqlalchemy as sa
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "how-to" / "fastapi.md"
SLOW = """
import sqlalchemy as sa
from fastapi import Depends

from shop_api import api, db_session


@api.get("/slow")
async def slow(db=Depends(db_session)):
    await db.execute(sa.text("SELECT pg_sleep(0.2)"))
    return {"ok": True}
"""


def guide_app() -> str:
    """The guide's `shop_api.py` block."""
    text = GUIDE.read_text()
    match = re.search(r"<!-- oncely:runnable file=shop_api.py -->\n```python\n(.*?)```", text, re.S)
    assert match, "docs/how-to/fastapi.md has no shop_api.py block"
    return match.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure(port: int) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        end = time.monotonic() + 3
        idle = 0
        while time.monotonic() < end:
            idle = max(idle, (await client.get("/pool")).json()["checked_out"])
            await asyncio.sleep(0.05)
        started = time.perf_counter()
        answers = await asyncio.gather(*(client.get("/slow") for _ in range(20)))
        took = time.perf_counter() - started
        assert all(a.status_code == 200 for a in answers)
    return {"idle_checked_out": idle, "slow_20_s": round(took, 2)}


def run(admin_url: str, concurrency: int, directory: Path) -> dict[str, object]:
    name = f"oncely_bench_pool_{os.getpid()}"
    sync_admin = make_url(admin_url).set(drivername="postgresql+psycopg2")
    admin = sa.create_engine(sync_admin, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(admin_url).set(drivername="postgresql+asyncpg", database=name)
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": url.render_as_string(hide_password=False),
        "WORKER_CONCURRENCY": str(concurrency),
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench_app:api", "--port", str(port)],
        cwd=directory,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/pool", timeout=1)
                break
            except httpx.HTTPError as exc:
                if time.monotonic() > deadline or server.poll() is not None:
                    why = server.stderr.read() if server.stderr else "no server"
                    raise RuntimeError(why) from exc
                time.sleep(0.1)
        return {"worker_concurrency": concurrency, **asyncio.run(measure(port))}
    finally:
        server.terminate()
        server.communicate(timeout=60)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[10, 4, 0])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "shop_api.py").write_text(guide_app())
        (directory / "bench_app.py").write_text(SLOW)
        for concurrency in args.concurrency:
            print(json.dumps(run(args.database_url, concurrency, directory)), flush=True)


if __name__ == "__main__":
    main()
