"""Take the screenshots of docs/dashboard.md: the dashboard's pages in Chromium, as the browser
tests drive them, over a history written by real runs of the dashboard test app.

A fresh SQLite database (or --database-url) gets the app's tables; `report` (hourly) runs
its last 36 slots through `app.run` (a few fail or time out, as the `script` table says, and
two are never run: missed); `nightly` is backfilled over a day; `beat` is paused; tasks are
enqueued and a worker runs the `mail` queue (one of them dies); one dead task is retried.
Then a real `python -m oncely web` process serves it, Playwright drives Debian's Chromium
(`/usr/bin/chromium`, no browser download) at 1280x800, and each page is saved as
docs/img/dashboard-{overview,job,tasks,task,audit}.png.

    PYTHONPATH=src python scripts/screenshots.py [--out docs/img] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from oncely import Oncely, TaskState  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
TOKEN = "screenshots"  # noqa: S105 (a local process for the length of the script)
VIEWPORT = {"width": 1280, "height": 800}
HOURS = 36
FAIL = {4, 5, 19}
SLOW = {27}
SKIP = {11, 12}
"""Hours back from the last slot of `report`: what each slot does."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def history(app: Oncely, url: str) -> int:
    """Write the history the pages show; the id of a task left dead."""
    from tests.apps import dashboard_app as d

    await app.migrate()
    engine = sa.create_engine(url.replace("+aiosqlite", ""))
    with engine.begin() as conn:
        for statement in d.TABLES:
            conn.exec_driver_sql(statement)
    last = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    slots = {back: last - timedelta(hours=back) for back in range(HOURS)}
    with engine.begin() as conn:
        for back, slot in slots.items():
            what = "fail" if back in FAIL else "slow" if back in SLOW else None
            if what:
                conn.execute(
                    sa.text("INSERT INTO script (slot, behaviour) VALUES (:s, :b)"),
                    {"s": slot.isoformat(), "b": what},
                )
    engine.dispose()
    for back in sorted(slots, reverse=True):
        if back not in SKIP:
            await app.attempt("report", slots[back])  # a failure is a result
    start = last - timedelta(days=2)
    await app.backfill("nightly", start, start + timedelta(days=1), actor="ops@acme")
    await app.pause("beat", reason="bad deploy: double charges", actor="ops@acme")
    ids = []
    for n in range(1, 13):
        ids.append((await d.send_receipt.enqueue_committed(app.store, order=n)).id)
    dead = [(await d.send_receipt.enqueue_committed(app.store, order=-n)).id for n in (7, 8, 9)]
    for n in range(8):
        await d.resize_image.enqueue_committed(app.store, path=f"/uploads/{n}.png")
    for n in range(5):
        await d.sync_crm.enqueue_committed(app.store, account=1000 + n, delay=3600)
    async with app.worker(jobs=["yearly"], queues=["mail"]):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            records = [await app.task_record(i) for i in [*ids, *dead]]
            if all(r.state in (TaskState.SUCCEEDED, TaskState.DEAD) for r in records):
                break
            await asyncio.sleep(0.1)
    await app.retry_task(dead[0], actor="ops@acme", reason="gateway is back")
    return dead[1]


def serve(url: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "ONCELY_APP": "tests.apps.dashboard_app:app",
        "ONCELY_DATABASE_URL": url,
        "ONCELY_TEST_HOLD": str(tmp / "release"),
    }
    args = ["web", "--host", "127.0.0.1", "--port", str(port), "--allow-actions"]
    server = subprocess.Popen(
        [sys.executable, "-m", "oncely", *args, "--token", TOKEN], cwd=ROOT, env=env
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"`oncely web` exited {server.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2):  # noqa: S310
                return server, base
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    server.kill()
    raise SystemExit("`oncely web` did not answer /healthz within 60 s")


def shoot(base: str, out: Path, dead: int) -> list[Path]:
    from playwright.sync_api import sync_playwright

    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(f"{base}/login")
        page.get_by_test_id("login").locator("input[name=token]").fill(TOKEN)
        page.get_by_test_id("login").locator("[type=submit]").click()
        page.wait_for_load_state()
        shots: list[tuple[str, str, Any]] = [
            ("overview", "/", None),
            ("job", "/jobs/report", None),
            ("tasks", "/tasks?queue=mail", None),
            ("task", f"/tasks/{dead}", None),
            ("audit", "/audit", None),
        ]
        for name, path, _ in shots:
            page.goto(f"{base}{path}")
            page.wait_for_load_state("networkidle")
            target = out / f"dashboard-{name}.png"
            page.screenshot(path=str(target))
            written.append(target)
        browser.close()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--database-url", help="an empty database (default: a new SQLite file)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="oncely-docs-") as folder:
        tmp = Path(folder)
        url = args.database_url or f"sqlite:///{tmp / 'dashboard.db'}"
        os.environ["ONCELY_TEST_HOLD"] = str(tmp / "release")
        from tests.apps.dashboard_app import app

        app.use_database(url)
        dead = asyncio.run(_history(app, url))
        server, base = serve(url, tmp)
        try:
            for path in shoot(base, args.out, dead):
                print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    return 0


async def _history(app: Oncely, url: str) -> int:
    try:
        return await history(app, url)
    finally:
        await app.aclose()


if __name__ == "__main__":
    sys.exit(main())
