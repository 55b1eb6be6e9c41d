"""A task whose worker was SIGKILLed mid-attempt: its page says the worker died (its lease
expired), not that an older schema or an operator's cancel wrote its error. A real worker
process, a real SIGKILL, the lease running out in database time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from tests.apps.queue_app import EFFECTS_DDL, hang
from tests.apps.web_app import build
from tests.support import ROOT, run_cli, wait_until
from tests.web.conftest import attrs

from oncely.web import dashboard

pytestmark = pytest.mark.timeout(180)


async def test_a_task_whose_worker_was_sigkilled_is_explained_as_its_worker_dying(
    db_url: str, sync_engine: sa.Engine, tmp_path: Path
) -> None:
    env = {**os.environ, "ONCELY_DATABASE_URL": db_url, "ONCELY_TEST_SIGNALS": str(tmp_path)}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    with sync_engine.begin() as conn:
        conn.exec_driver_sql(EFFECTS_DDL)
    with Session(sync_engine) as session, session.begin():
        task_id = hang.enqueue_sync(session, n=1).id
    script = str(ROOT / "tests" / "apps" / "queue_worker.py")
    worker = subprocess.Popen(
        [sys.executable, script, "tests.apps.queue_app:app", "--lease", "1", "--concurrency", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: sorted(tmp_path.glob("started-1-*")), "the task to start")
    finally:
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    app = build(db_url)
    try:
        deadline = time.monotonic() + 60
        while not await app.store.tasks.rescue():  # what a live worker's upkeep does
            assert time.monotonic() < deadline, "the dead worker's lease never ran out"
            time.sleep(0.1)
        transport = httpx.ASGITransport(app=dashboard(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as client:
            html = (await client.get(f"/tasks/{task_id}")).text
    finally:
        await app.aclose()
    assert attrs(html, "task", "data-state") == ["available"]
    assert attrs(html, "task-errors-note", "data-origin") == ["lease"]
    assert "its worker died (lease expired)" in html
    assert "schema" not in html.split('data-testid="task-errors-note"')[1].split("</p>")[0]
    assert "operator" not in html.split('data-testid="task-errors-note"')[1].split("</p>")[0]
