"""Every page of the dashboard renders with real data, on SQLite and Postgres: the overview,
a job's timeline (one mark per expected slot, coloured by what the database recorded), the
task listing with its keyset pagination and filters, a task, the audit trail."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import sqlalchemy as sa
from tests.web.conftest import HOUR, Web, allow_all, attrs

from oncely import RetryPolicy
from oncely.queue import worker
from oncely.store.tables import attempts, pauses


async def _history(web: Web) -> None:
    """hourly ran two hours ago (twice: one duplicate) and four hours ago; boom failed three
    hours ago."""
    app = web.app
    await app.run("hourly", web.last_hour(2))
    await app.run("hourly", web.last_hour(2))  # a duplicate: suppressed, recorded
    key = web.last_hour(2).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert web.rows("SELECT job, key FROM oncely_duplicates") == [("hourly", key)]
    await app.run("hourly", web.last_hour(4))
    await app.attempt("boom", web.last_hour(3))


async def test_overview_shows_every_job_counts_and_the_strip(web: Web) -> None:
    await _history(web)
    await web.app.pause("boom", reason="tax API down", actor="ana@ops")
    page = await web.board().get("/")
    assert page.status_code == 200
    html = page.text
    assert attrs(html, "job-row", "data-job") == ["boom", "hourly", "nightly"]
    assert attrs(html, "job-row", "data-paused") == ["true", "false", "false"]
    assert 'href="/jobs/hourly"' in html
    assert "every hour" in html and "at 02:30" in html and "America/New_York" in html
    assert "paused by ana@ops" in html and "tax API down" in html
    assert attrs(html, "duplicates-24h", "data-count") == ["1"]
    totals = dict(
        zip(attrs(html, "series", "data-series"), attrs(html, "series", "data-total"), strict=True)
    )
    assert totals["runs"] == "2" and totals["duplicates"] == "1" and totals["failures"] == "1"
    assert attrs(html, "task-count", "data-state") == [
        "available",
        "running",
        "succeeded",
        "discarded",
        "dead",
    ]


async def test_the_timeline_has_one_mark_per_slot_coloured_by_outcome(web: Web) -> None:
    await _history(web)
    board = web.board()
    html = (await board.get("/jobs/hourly", n="6")).text
    marks = attrs(html, "slot-mark", "data-outcome")
    slots = attrs(html, "slot-mark", "data-slot")
    assert len(marks) == 6
    assert slots[-1] == web.last_hour(0).isoformat()
    by_slot = dict(zip(slots, marks, strict=True))
    assert by_slot[web.last_hour(2).isoformat()] == "ran"
    assert by_slot[web.last_hour(4).isoformat()] == "ran"
    # The oldest slot came before the job's first claim: never expected, not missed.
    assert marks == ["before_job", "ran", "missed", "ran", "missed", "missed"]
    # The verdict: the slots after it that did not run are findings.
    kinds = attrs(html, "finding", "data-kind")
    assert set(kinds) == {"unaccounted"} and len(kinds) in (2, 3), kinds
    assert web.last_hour(3).isoformat() in attrs(html, "finding", "data-slot")
    rows = dict(
        zip(
            attrs(html, "slot-row", "data-slot"),
            attrs(html, "duplicates", "data-count"),
            strict=True,
        )
    )
    assert rows[web.last_hour(2).isoformat()] == "1"
    assert "ran: claimed by" in html  # each slot's explanation
    boom = (await board.get("/jobs/boom", n="4")).text
    assert attrs(boom, "slot-mark", "data-outcome").count("failed") == 1
    assert "RuntimeError: the tax API returned 500" in boom


async def test_timed_out_cancelled_and_paused_slots_have_their_colours(web: Web) -> None:
    now = web.now()
    one, two, three = (web.last_hour(n) for n in (1, 2, 3))
    with web.engine.begin() as conn:
        for slot, outcome in ((one, "timeout"), (two, "cancelled")):
            conn.execute(
                attempts.insert().values(
                    job="hourly",
                    key=slot.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    slot=slot,
                    outcome=outcome,
                    replica="web-1",
                    started_at=slot,
                    finished_at=slot + HOUR / 2,
                    recorded_at=now,
                    cancel_requested_by="ana@ops" if outcome == "cancelled" else None,
                )
            )
        conn.execute(
            pauses.insert().values(
                job="hourly",
                paused_at=three - HOUR / 2,
                paused_by="ana@ops",
                resumed_at=three + HOUR / 2,
                resumed_by="ana@ops",
            )
        )
    html = (await web.board().get("/jobs/hourly", n="4")).text
    assert attrs(html, "slot-mark", "data-outcome") == [
        "paused",
        "cancelled",
        "timed_out",
        "missed",
    ]


async def test_a_cron_job_in_a_zone_lists_its_slots_in_that_zone(web: Web) -> None:
    html = (await web.board().get("/jobs/nightly", n="5")).text
    slots = attrs(html, "slot-mark", "data-slot")
    assert len(slots) == 5
    assert all("T02:30:00-0" in s for s in slots)  # New York wall time, -05:00 or -04:00
    assert len(attrs(html, "next-slot")) == 5


async def _tasks(web: Web, n: int) -> list[int]:
    ids = []
    for i in range(n):
        task = web.app.tasks.get("charge" if i % 2 else "send_receipt")
        rec = await task.enqueue_committed(web.app.store, order_id=i, idempotency_key=f"order:{i}")
        ids.append(rec.id)
    return ids


async def test_tasks_page_by_keyset_with_filters(web: Web) -> None:
    ids = await _tasks(web, 120)
    board = web.board()
    seen: list[str] = []
    page = await board.get("/tasks")
    pages = 1
    while True:
        assert page.status_code == 200
        seen += attrs(page.text, "task-row", "data-task-id")
        nxt = attrs(page.text, "next-page")
        if not nxt:
            break
        link = page.text.split('data-testid="next-page" href="', 1)[1].split('"', 1)[0]
        page = await board.client.get(link.replace("&amp;", "&"))
        pages += 1
    assert [int(i) for i in seen] == sorted(ids, reverse=True)
    assert pages == 3
    html = (await board.get("/tasks", queue="payments")).text
    assert len(attrs(html, "task-row")) == 50
    html = (await board.get("/tasks", task="charge", key="order:7")).text
    assert attrs(html, "task-row", "data-task-id") == [str(ids[7])]
    html = (await board.get("/tasks", key="order:8")).text  # a key of any registered task
    assert attrs(html, "task-row", "data-task-id") == [str(ids[8])]
    html = (await board.get("/tasks", state="dead")).text
    assert attrs(html, "task-row") == []
    assert 'data-testid="task-filter"' in html and 'data-testid="bulk"' not in html  # read-only
    assert 'data-testid="read-only"' in html


async def test_task_page_shows_arguments_attempts_error_and_lease(web: Web) -> None:
    (task_id,) = await _tasks(web, 1)
    with web.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE oncely_tasks SET state = 'dead', attempt = 3, "
            "error = 'ValueError: bad order\nTraceback (most recent call last):\n  File x'"
        )
    html = (await web.board().get(f"/tasks/{task_id}")).text
    args = html.split('data-testid="task-args">', 1)[1].split("</pre>", 1)[0]
    assert json.loads(args.replace("&#34;", '"')) == {"order_id": 0}
    assert "Traceback (most recent call last)" in html and "ValueError: bad order" in html
    assert attrs(html, "task", "data-state") == ["dead"]
    for button in ("retry", "discard", "cancel"):  # read-only: no button, and why
        assert attrs(html, button) == []
    assert len(attrs(html, "read-only")) == 1
    acting = (await web.board(permissions=allow_all).get(f"/tasks/{task_id}")).text
    assert [len(attrs(acting, b)) for b in ("retry", "discard", "cancel")] == [1, 1, 0]


async def test_task_page_lists_every_failed_attempt_newest_first(web: Web) -> None:
    """Each failed attempt's error and traceback, its number and worker, credentials masked;
    past 50 the newest 50 and a note; a task without history keeps the older note."""
    app = web.app
    failures = iter(["gateway timeout", "bad gateway at postgresql://bo:s3cret@db/pay"])

    @app.task(retry=RetryPolicy(attempts=2, wait=0.01, backoff="fixed", jitter=0))
    async def flaky(db):  # type: ignore[no-untyped-def]
        raise RuntimeError(next(failures))

    task_id = (await flaky.enqueue_committed(app.store)).id
    runner = worker(app)
    try:
        for _ in range(2):
            deadline = time.monotonic() + 10
            while not await runner.step():
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
    finally:
        await runner.close()
    html = (await web.board().get(f"/tasks/{task_id}")).text
    assert attrs(html, "task", "data-state") == ["dead"]
    assert attrs(html, "task-errors", "data-count") == ["2"]
    assert attrs(html, "task-attempt-error", "data-attempt") == ["2", "1"]
    first, second = html.split('data-testid="task-attempt-error"')[2:0:-1]
    assert "RuntimeError: gateway timeout" in first and "Traceback" in first
    assert "RuntimeError: bad gateway at postgresql://bo:***@db/pay" in second
    assert runner.by in second
    assert "s3cret" not in html
    assert "were replaced" not in html and attrs(html, "task-errors-more") == []

    # More than 50: the newest 50, and a note.
    with web.engine.begin() as conn:
        for n in range(3, 54):
            conn.execute(
                sa.text(
                    "INSERT INTO oncely_task_errors (task_id, attempt, error, by, at) "
                    "VALUES (:t, :n, :e, 'w', :at)"
                ),
                {"t": task_id, "n": n, "e": f"E: {n}", "at": web.now()},
            )
    html = (await web.board().get(f"/tasks/{task_id}")).text
    shown = attrs(html, "task-attempt-error", "data-attempt")
    assert shown == [str(n) for n in range(53, 3, -1)]
    assert len(attrs(html, "task-errors-more")) == 1

    # An error on the row without history (written before schema 11): the note says so.
    (other,) = await _tasks(web, 1)
    with web.engine.begin() as conn:
        conn.exec_driver_sql(
            f"UPDATE oncely_tasks SET state = 'dead', error = 'E: x' WHERE id = {other}"
        )
    html = (await web.board().get(f"/tasks/{other}")).text
    assert attrs(html, "task-errors") == [] and len(attrs(html, "task-errors-note")) == 1


async def test_audit_page_filters(web: Web) -> None:
    await web.app.pause("hourly", actor="ana@ops")
    await web.app.resume("hourly", actor="bo@ops")
    await web.app.pause("boom", actor="ana@ops")
    board = web.board()
    html = (await board.get("/audit")).text
    assert attrs(html, "audit-row", "data-action") == ["pause", "resume", "pause"]
    html = (await board.get("/audit", job="hourly")).text
    assert attrs(html, "audit-row", "data-action") == ["resume", "pause"]
    html = (await board.get("/audit", actor="ana@ops", action="pause")).text
    assert attrs(html, "audit-row", "data-job") == ["boom", "hourly"]


@pytest.mark.parametrize("path", ["/", "/jobs/hourly", "/tasks", "/audit", "/login"])
async def test_pages_under_a_mount_link_under_it(web: Web, path: str) -> None:
    board = web.board(prefix="/ops/oncely")
    page = await board.get(path)
    assert page.status_code == 200
    assert 'href="/ops/oncely/static/oncely.css"' in page.text
    assert (await board.get("/static/oncely.css")).status_code == 200
    assert (await board.get("/healthz")).text == "ok"
