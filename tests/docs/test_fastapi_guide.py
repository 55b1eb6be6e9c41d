"""docs/how-to/fastapi.md under a real uvicorn process on Postgres: a request enqueues in its
own transaction (a failed request leaves no task), the lifespan worker runs the task once, a
duplicate request (one after the other, or at the same time) has one effect, and SIGTERM
stops it cleanly."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from tests.conftest import _reset_postgres, _sync_url
from tests.support import ROOT, wait_until

GUIDE = ROOT / "docs" / "how-to" / "fastapi.md"
FAILING = """
from fastapi import Depends, HTTPException

from shop_api import api, db_session, send_receipt


@api.post("/orders/{order_id}/pay-then-fail")
async def pay_then_fail(order_id: int, db=Depends(db_session)):
    await send_receipt.enqueue(db, order_id=order_id, idempotency_key=f"receipt:{order_id}")
    raise HTTPException(status_code=503, detail="the gateway timed out after enqueueing")
"""

pytestmark = pytest.mark.postgres


def guide_app() -> str:
    match = re.search(
        r"<!-- oncely:runnable file=shop_api.py -->\n```python\n(.*?)```", GUIDE.read_text(), re.S
    )
    assert match, "docs/how-to/fastapi.md has no shop_api.py block"
    return match.group(1)


@pytest.fixture
def server(
    tmp_path: Path, postgres_database: str
) -> Iterator[tuple[str, sa.Engine, subprocess.Popen[str]]]:
    _reset_postgres(postgres_database)
    (tmp_path / "shop_api.py").write_text(guide_app())
    (tmp_path / "failing_app.py").write_text(FAILING)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = make_url(postgres_database).set(drivername="postgresql+asyncpg")
    env = {**os.environ, "DATABASE_URL": url.render_as_string(hide_password=False)}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "failing_app:api", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/pool", timeout=2).status_code == 200
        except httpx.HTTPError:
            assert proc.poll() is None, proc.communicate()[0]
            return False

    engine = sa.create_engine(_sync_url(postgres_database))
    try:
        wait_until(up, "uvicorn to serve")
        yield base, engine, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
        engine.dispose()


def scalar(engine: sa.Engine, query: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(query)).scalar_one())


def test_the_fastapi_guide_under_uvicorn_runs_each_receipt_once(
    server: tuple[str, sa.Engine, subprocess.Popen[str]],
) -> None:
    base, engine, proc = server
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO orders VALUES (42, 'new'), (43, 'new'), (44, 'new')"))

    # A request that fails after enqueueing rolls its task back with it.
    failed = httpx.post(f"{base}/orders/44/pay-then-fail", timeout=30)
    assert failed.status_code == 503
    assert scalar(engine, "SELECT count(*) FROM oncely_tasks") == 0

    # The same request twice, one after the other: one task, the second is a duplicate.
    first = httpx.post(f"{base}/orders/42/pay", timeout=30).json()
    again = httpx.post(f"{base}/orders/42/pay", timeout=30).json()
    assert first["duplicate"] is False and again == {"task": first["task"], "duplicate": True}

    # ... and at the same time.
    async def together() -> list[dict[str, object]]:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            answers = await asyncio.gather(*(client.post("/orders/43/pay") for _ in range(2)))
        return [a.json() for a in answers]

    both = asyncio.run(together())
    assert sorted(a["duplicate"] for a in both) == [False, True]
    assert len({a["task"] for a in both}) == 1

    done = "SELECT count(*) FROM oncely_tasks WHERE state = 'succeeded' AND attempt = 1"
    wait_until(lambda: scalar(engine, done) == 2, "the lifespan worker to run both tasks")
    assert scalar(engine, "SELECT count(*) FROM oncely_tasks") == 2
    assert scalar(engine, "SELECT count(*) FROM receipts WHERE order_id = 42") == 1
    assert scalar(engine, "SELECT count(*) FROM receipts WHERE order_id = 43") == 1
    assert scalar(engine, "SELECT count(*) FROM receipts WHERE order_id = 44") == 0
    assert scalar(engine, "SELECT count(*) FROM orders WHERE status = 'paid'") == 2

    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly.
    assert proc.returncode in (0, -signal.SIGTERM), out
    assert "Application shutdown complete." in out and "Traceback" not in out
