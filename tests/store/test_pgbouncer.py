"""Behind a real PgBouncer in transaction pooling mode: slot runs, enqueueing and a worker
that drains by polling (LISTEN cannot work there: a client holds a server connection only for
a transaction), with the engine built as docs/tasks.md says (no named prepared statements)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.pool import NullPool
from tests.conftest import _reset_postgres
from tests.queue.queue_helpers import EFFECTS_DDL, effects
from tests.support import IN_CI

from oncely import Oncely, RunStatus, every
from oncely.queue import consume, list_tasks

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
SLOT = datetime(2026, 11, 27, 18, 0, tzinfo=timezone.utc)
INSERT = sa.text("INSERT INTO effects (n) VALUES (:n)")

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        not Path(PGBOUNCER).exists() and not IN_CI, reason="pgbouncer is not installed"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def pgbouncer(postgres_database: str) -> Iterator[str]:
    """A PgBouncer in transaction pooling mode in front of the test database; its URL."""
    server = make_url(postgres_database)
    folder = Path(tempfile.mkdtemp(prefix="oncely-pgbouncer-"))
    folder.chmod(0o755)  # pgbouncer drops root for the postgres user, who must read these
    port = _free_port()
    (folder / "users.txt").write_text(f'"{server.username}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.host} port={server.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 3\nmax_client_conn = 100\n"
        # Each transaction goes to the next server connection: what a client prepared in one
        # is not there in the next. A client waiting for a server errs after 10 s.
        "server_round_robin = 1\nquery_wait_timeout = 10\n"
    )
    for path in folder.iterdir():
        path.chmod(0o644)
    user = ["-u", "postgres"] if os.geteuid() == 0 else []
    # Its log goes to a file: a pipe nobody reads fills up, and PgBouncer, blocked writing
    # its log, stops answering every client.
    log = (folder / "pgbouncer.log").open("wb")
    proc = subprocess.Popen(
        [PGBOUNCER, *user, str(folder / "pgbouncer.ini")], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 20
        while not _accepts(port):
            assert proc.poll() is None, (folder / "pgbouncer.log").read_text()
            assert time.monotonic() < deadline, "pgbouncer did not start listening"
            time.sleep(0.05)
        yield server.set(port=port).render_as_string(hide_password=False)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # clients still connected after a failure
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def pooled_engine(url: str) -> AsyncEngine:
    """The engine docs/tasks.md gives for a transaction-pooling PgBouncer."""
    return create_async_engine(
        make_url(url).set(drivername="postgresql+asyncpg"),
        poolclass=NullPool,
        connect_args={
            "statement_cache_size": 0,
            "prepared_statement_cache_size": 0,
            "prepared_statement_name_func": lambda: f"__asyncpg_{uuid.uuid4()}__",
        },
    )


@pytest.fixture
async def app(pgbouncer: str, postgres_database: str) -> AsyncIterator[Oncely]:
    _reset_postgres(postgres_database)
    engine = pooled_engine(pgbouncer)
    oncely = Oncely(engine, lease=5)
    await oncely.migrate()
    async with engine.begin() as conn:
        await conn.execute(sa.text(EFFECTS_DDL))
    try:
        yield oncely
    finally:
        await oncely.aclose()
        await engine.dispose()


async def until(check, what: str, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_slots_run_once_behind_pgbouncer(app: Oncely) -> None:
    @app.job(every(minutes=1), name="tick")
    async def tick(db, now):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": 1})

    first = await app.run("tick", now=SLOT)
    second = await app.run("tick", now=SLOT)
    assert (first.status, second.status) == (RunStatus.RAN, RunStatus.SKIPPED)
    assert await effects(app) == [1]


async def test_a_worker_drains_by_polling_behind_pgbouncer(
    app: Oncely, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task
    async def record(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(INSERT, {"n": n})

    async with AsyncSession(app.store.engine) as db:
        async with db.begin():
            await record.enqueue(db, n=-1)
            await db.rollback()  # the task exists iff its transaction commits
        async with db.begin():
            await record.enqueue_many(db, [{"n": n} for n in range(60)])
        async with db.begin():
            again = await record.enqueue(db, n=100, idempotency_key="k")
            twice = await record.enqueue(db, n=100, idempotency_key="k")
    assert twice.duplicate and twice.id == again.id

    stopping = asyncio.Event()
    worker = asyncio.create_task(consume(app, stopping, concurrency=3, poll=0.1))
    try:
        await until(lambda: _count(app, 61), "the first tasks")
        async with AsyncSession(app.store.engine) as db, db.begin():
            await record.enqueue(db, n=200)  # enqueued while the worker is idle
        await until(lambda: _count(app, 62), "the late task")
    finally:
        stopping.set()
        await asyncio.wait_for(worker, 30)
    assert await effects(app) == [*range(60), 100, 200]
    assert {r.state.value for r in await list_tasks(app, limit=100)} == {"succeeded"}
    # LISTEN goes through, but its probe notification never comes back: the worker polls
    # (it does not wait for notifications that cannot arrive).
    assert "no notification arrives" in caplog.text or "cannot LISTEN" in caplog.text


async def _count(app: Oncely, n: int) -> bool:
    return len(await effects(app)) >= n
