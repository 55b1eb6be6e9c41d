"""Every action of the dashboard calls the public API and writes its audit row with the
actor the resolver names; each refusal (not allowed, no CSRF token, bad input) is a clear
error page and changes nothing. SQLite and Postgres."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from tests.web.conftest import Board, Web, allow_all, attrs, error_text

from oncely.errors import BadInputError
from oncely.web import Grant

HOUR = timedelta(hours=1)


def _ana(_request: Any) -> Grant:
    return Grant("all", actor="ana@ops")


def _effects(web: Web, job: str) -> list[str]:
    return [
        r[0] for r in web.rows("SELECT key FROM oncely_runs WHERE job = :j ORDER BY key", j=job)
    ]


async def _flash(board: Board, response: Any) -> str:
    assert response.status_code == 303, response.text
    landed = await board.client.get(response.headers["location"])
    (flash,) = landed.text.split('data-testid="flash" role="status">', 1)[1:]
    return flash.split("</div>", 1)[0]


async def test_pause_and_resume_are_audited_with_the_resolvers_actor(web: Web) -> None:
    board = web.board(permissions=_ana)
    r = await board.post("/jobs/hourly/pause", reason="tax API down")
    assert r.headers["location"] == "/jobs/hourly"
    assert "paused hourly" in await _flash(board, r)
    assert web.rows("SELECT job, paused_by, reason FROM oncely_pauses") == [
        ("hourly", "ana@ops", "tax API down")
    ]
    html = (await board.get("/")).text
    assert (
        dict(
            zip(
                attrs(html, "job-row", "data-job"),
                attrs(html, "job-row", "data-paused"),
                strict=True,
            )
        )["hourly"]
        == "true"
    )
    r = await board.post("/jobs/hourly/resume")
    assert "resumed hourly" in await _flash(board, r)
    assert web.audit() == [
        ("pause", "hourly", "ana@ops", "paused"),
        ("resume", "hourly", "ana@ops", "resumed"),
    ]


async def test_run_now_runs_one_slot_once_and_is_audited(web: Web) -> None:
    board = web.board(permissions=_ana)
    slot = web.last_hour(3)
    r = await board.post("/jobs/hourly/run", slot=slot.isoformat())
    assert "ran 1" in await _flash(board, r)
    r = await board.post("/jobs/hourly/run", slot=slot.isoformat())
    assert "nothing to run" in await _flash(board, r)
    assert _effects(web, "hourly") == [slot.strftime("%Y-%m-%dT%H:%M:%SZ")]
    assert [a[0] for a in web.audit()] == ["run_slot", "run_slot"]  # not a backfill
    assert {a[2] for a in web.audit()} == {"ana@ops"}
    r = await board.post("/jobs/hourly/run")  # the latest due slot
    assert "ran 1" in await _flash(board, r)
    assert len(_effects(web, "hourly")) == 2


async def test_backfill_shows_the_plan_then_applies_it(web: Web) -> None:
    board = web.board(permissions=_ana)
    start, end = web.last_hour(5), web.last_hour(1)
    await web.app.run("hourly", web.last_hour(3))
    plan = await board.post("/jobs/hourly/backfill", start=start.isoformat(), end=end.isoformat())
    assert plan.status_code == 200
    assert attrs(plan.text, "plan-row", "data-action") == [
        "would run",
        "would run",
        "already ran",
        "would run",
    ]
    assert len(attrs(plan.text, "backfill-apply")) == 1
    assert len(_effects(web, "hourly")) == 1 and web.audit() == []  # the plan changed nothing
    r = await board.post(
        "/jobs/hourly/backfill", start=start.isoformat(), end=end.isoformat(), apply="1"
    )
    assert "ran 3" in await _flash(board, r)
    assert len(_effects(web, "hourly")) == 4
    ((action, _target, actor, result),) = web.audit()
    assert (action, actor, result) == ("backfill", "ana@ops", "ran 3")


async def test_release_deletes_the_claim_and_is_audited(web: Web) -> None:
    board = web.board(permissions=_ana)
    slot = web.last_hour(2)
    await web.app.run("hourly", slot)
    key = slot.strftime("%Y-%m-%dT%H:%M:%SZ")
    html = (await board.get("/jobs/hourly")).text
    assert len(attrs(html, "release")) == 1
    r = await board.post("/jobs/hourly/release", key=key)
    assert "released hourly" in await _flash(board, r)
    assert _effects(web, "hourly") == []
    ((action, target, actor, result),) = web.audit()
    assert (action, target, actor) == ("release", f"hourly {key}", "ana@ops")
    assert result.startswith("released (ran at "), result  # what it freed


async def test_release_frees_a_given_up_slot_and_is_audited(web: Web) -> None:
    """A slot whose attempt failed has no claim but a given-up mark: the dashboard's release
    clears it (the slot runs again), not "nothing released"."""
    board = web.board(permissions=_ana)
    slot = web.last_hour(2)
    with pytest.raises(RuntimeError):
        await web.app.run("boom", slot)
    assert (await web.app.run("boom", slot)).status.value == "given_up"
    key = web.app.registry.job("boom").key_for(slot)
    r = await board.post("/jobs/boom/release", key=key)
    assert "released boom" in await _flash(board, r)
    assert web.audit()[-1] == ("release", f"boom {key}", "ana@ops", "released (given up)")
    with pytest.raises(RuntimeError):  # free again: the job is called, and raises again
        await web.app.run("boom", slot)


async def test_cancel_with_nothing_running_is_a_clear_error_and_changes_nothing(web: Web) -> None:
    board = web.board(permissions=_ana)
    before = web.snapshot()
    r = await board.post("/jobs/hourly/cancel")
    assert r.status_code == 400
    assert "is running: nothing to cancel" in error_text(r.text) or "SQLite" in error_text(r.text)
    assert web.snapshot() == before


async def _dead(web: Web, n: int = 1) -> list[int]:
    ids = []
    for i in range(n):
        rec = await web.app.tasks.get("charge").enqueue_committed(web.app.store, order_id=i)
        ids.append(rec.id)
    with web.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE oncely_tasks SET state = 'dead', attempt = 25, error = 'GatewayTimeout: x'"
        )
    return ids


async def test_task_retry_discard_cancel_are_audited(web: Web) -> None:
    board = web.board(permissions=_ana)
    a, b = await _dead(web, 2)
    r = await board.post(f"/tasks/{a}/retry")
    assert r.headers["location"] == f"/tasks/{a}"
    assert "will run again now" in await _flash(board, r)
    r = await board.post(f"/tasks/{b}/discard")
    assert "discarded" in await _flash(board, r)
    r = await board.post(f"/tasks/{a}/cancel")  # available again: discarded at once
    assert "discarded" in await _flash(board, r)
    states = dict(web.rows("SELECT id, state FROM oncely_tasks"))
    assert states == {a: "discarded", b: "discarded"}
    assert [(x[0], x[1], x[2]) for x in web.audit()] == [
        ("task_retry", f"task {a}", "ana@ops"),
        ("task_discard", f"task {b}", "ana@ops"),
        ("task_cancel", f"task {a}", "ana@ops"),
    ]


async def test_bulk_retry_counts_first_then_needs_the_confirmation(web: Web) -> None:
    board = web.board(permissions=_ana)
    ids = await _dead(web, 3)
    await web.app.tasks.get("send_receipt").enqueue_committed(web.app.store, order_id=9)
    r = await board.post("/tasks/bulk", action="retry", state="dead")
    assert r.status_code == 200
    assert attrs(r.text, "bulk-count", "data-count") == ["3"]
    assert len(attrs(r.text, "bulk-confirm")) == 1
    assert web.audit() == []  # counting changed nothing
    assert {s for (s,) in web.rows("SELECT state FROM oncely_tasks WHERE task = 'charge'")} == {
        "dead"
    }
    upto = r.text.split('name="upto" value="', 1)[1].split('"', 1)[0]
    r = await board.post("/tasks/bulk", action="retry", state="dead", upto=upto, confirm="1")
    assert "retry: 3 tasks" in await _flash(board, r)
    assert dict(
        web.rows("SELECT id, state FROM oncely_tasks WHERE task = 'charge'")
    ) == dict.fromkeys(ids, "available")
    assert sorted(x[1] for x in web.audit()) == sorted(f"task {i}" for i in ids)


ACTIONS = [
    ("/jobs/hourly/pause", {}),
    ("/jobs/hourly/resume", {}),
    ("/jobs/hourly/run", {}),
    (
        "/jobs/hourly/backfill",
        {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T03:00:00Z", "apply": "1"},
    ),
    ("/jobs/hourly/release", {"key": "KEY"}),
    ("/jobs/hourly/cancel", {}),
    ("/tasks/TASK/retry", {}),
    ("/tasks/TASK/discard", {}),
    ("/tasks/TASK/cancel", {}),
    ("/tasks/bulk", {"action": "retry", "state": "dead", "confirm": "1"}),
]


async def _fixture_rows(web: Web) -> tuple[str, int]:
    slot = web.last_hour(2)
    await web.app.run("hourly", slot)
    (task_id,) = await _dead(web)
    return slot.strftime("%Y-%m-%dT%H:%M:%SZ"), task_id


def _path(path: str, data: dict[str, str], key: str, task_id: int) -> tuple[str, dict[str, str]]:
    data = {k: (key if v == "KEY" else v) for k, v in data.items()}
    return path.replace("TASK", str(task_id)), data


@pytest.mark.parametrize("path,data", ACTIONS, ids=[a[0] for a in ACTIONS])
async def test_read_only_refuses_every_action_and_changes_nothing(
    web: Web, path: str, data: dict[str, str]
) -> None:
    key, task_id = await _fixture_rows(web)
    await web.app.pause("boom")  # something to resume
    path, data = _path(path.replace("hourly/resume", "boom/resume"), data, key, task_id)
    before = web.snapshot()
    board = web.board()  # the default: read-only
    r = await board.post(path, **data)
    assert r.status_code == 403, r.text
    assert "not allowed" in r.text and 'data-testid="error"' in r.text
    assert web.snapshot() == before
    html = (await board.get("/")).text
    assert attrs(html, "mode", "data-mode") == ["read-only"]


@pytest.mark.parametrize("path,data", ACTIONS, ids=[a[0] for a in ACTIONS])
async def test_a_missing_or_wrong_csrf_token_is_refused(
    web: Web, path: str, data: dict[str, str]
) -> None:
    key, task_id = await _fixture_rows(web)
    path, data = _path(path, data, key, task_id)
    before = web.snapshot()
    board = web.board(permissions=allow_all)
    await board.get("/")  # the CSRF cookie is set
    r = await board.post(path, with_csrf=False, **data)
    assert r.status_code == 403 and "CSRF" in r.text
    r = await board.post(path, with_csrf=False, **{**data, "csrf": "forged"})
    assert r.status_code == 403 and "CSRF" in r.text
    assert web.snapshot() == before


async def test_a_resolver_that_returns_none_refuses_every_page(web: Web) -> None:
    board = web.board(permissions=lambda _r: None)
    for path in ("/", "/jobs/hourly", "/tasks", "/tasks/1", "/audit"):
        r = await board.get(path)
        assert r.status_code == 403 and 'data-testid="error"' in r.text, path
    before = web.snapshot()
    assert (await board.post("/jobs/hourly/pause")).status_code == 403
    assert web.snapshot() == before
    assert (await board.get("/healthz")).text == "ok"


async def test_a_set_of_actions_allows_those_only(web: Web) -> None:
    board = web.board(permissions=lambda _r: Grant({"pause"}, actor="bo@ops"))
    r = await board.post("/jobs/hourly/pause")
    assert r.status_code == 303
    r = await board.post("/jobs/hourly/resume")
    assert r.status_code == 403
    assert web.audit() == [("pause", "hourly", "bo@ops", "paused")]


async def test_bad_input_is_a_clear_error_and_changes_nothing(web: Web) -> None:
    board = web.board(permissions=_ana)
    await web.app.run("hourly", web.last_hour(1))
    before = web.snapshot()
    cases = [
        ("get", "/jobs/nope", {}, 404, "unknown job 'nope'"),
        ("post", "/jobs/nope/pause", {}, 404, "unknown job 'nope'"),
        (
            "post",
            "/jobs/nope/backfill",
            {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"},
            404,
            "unknown job",
        ),
        (
            "post",
            "/jobs/hourly/backfill",
            {"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"},
            400,
            "bad range",
        ),
        (
            "post",
            "/jobs/hourly/backfill",
            {"start": "yesterday", "end": "2026-01-01T00:00:00Z"},
            400,
            "bad start",
        ),
        (
            "post",
            "/jobs/hourly/backfill",
            {"start": "2020-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z", "apply": "1"},
            400,
            "more than 1000 slots",
        ),
        ("post", "/jobs/hourly/run", {"slot": "2026-01-01T00:30:00Z"}, 400, "has no slot then"),
        ("post", "/jobs/hourly/release", {"key": "no-such-key"}, 400, "no claim"),
        ("post", "/jobs/hourly/resume", {}, 400, "not paused"),
        ("get", "/tasks/999999", {}, 404, "no task with id 999999"),
        ("post", "/tasks/999999/retry", {}, 404, "no task with id 999999"),
        ("get", "/tasks/abc", {}, 404, "bad cursor"),
        ("get", "/tasks", {"state": "sleeping"}, 400, "bad state"),
        ("get", "/jobs/hourly", {"n": "0"}, 400, "bad n"),
        ("post", "/tasks/bulk", {"action": "explode"}, 400, "bad action"),
    ]
    for method, path, data, status, message in cases:
        if method == "get":
            r = await board.get(path, **data)
        else:
            r = await board.post(path, **data)
        assert r.status_code == status, (path, r.status_code, r.text[-400:])
        assert message in error_text(r.text), (path, error_text(r.text))
    after = web.snapshot()
    refused = after.pop("oncely_audit")  # "not paused" is a refusal with its own audit row
    assert after == {k: v for k, v in before.items() if k != "oncely_audit"}
    assert len(refused) == 1 and "refused: job 'hourly' is not paused" in str(refused)


async def test_no_secret_is_rendered(web: Web) -> None:
    def redact(task: str, args: dict[str, object]) -> object:
        return {**args, "card": "****"} if "card" in args else args

    secret = "hunter2-secret"
    rec = await web.app.tasks.get("charge").enqueue_committed(
        web.app.store, order_id=1, card="4111111111111111"
    )
    with web.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE oncely_tasks SET state = 'dead', "
            f"error = 'OperationalError: cannot reach postgresql://app:{secret}@db:5432/shop'"
        )
    board = web.board(redact=redact)
    pages = [
        await board.get(p) for p in ("/", "/tasks", f"/tasks/{rec.id}", "/jobs/hourly", "/audit")
    ]
    for page in pages:
        assert page.status_code == 200
        assert secret not in page.text and "4111111111111111" not in page.text
    assert "****" in pages[2].text and "postgresql://app:***@db:5432/shop" in pages[2].text


@pytest.mark.postgres
async def test_the_database_password_is_never_rendered(postgres_database: str) -> None:
    # Postgres trusts the test user: the password in the URL is carried, never checked.
    import httpx
    from sqlalchemy.engine import make_url
    from tests.apps.web_app import build

    from oncely.web import dashboard

    url = make_url(postgres_database).set(password="s3cr3t-pw").render_as_string(False)
    app = build(url)
    await app.migrate()
    try:
        transport = httpx.ASGITransport(app=dashboard(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as client:
            for path in ("/", "/jobs/hourly", "/tasks", "/audit", "/jobs/nope"):
                page = await client.get(path)
                assert "s3cr3t-pw" not in page.text, path
            assert "postgres:***@" in page.text
    finally:
        await app.aclose()


async def test_run_slot_refuses_a_future_slot_unless_allowed(web: Web) -> None:
    board = web.board(permissions=_ana)
    r = await board.post("/jobs/hourly/run", slot="2031-01-01T00:00:00+00:00")
    assert r.status_code == 400
    assert "not due yet" in error_text(r.text), r.text
    assert _effects(web, "hourly") == []
    ahead = web.last_hour(-2)  # two hours ahead: a range ending in the future
    r = await board.post("/jobs/hourly/run", slot=ahead.isoformat())
    assert r.status_code == 400 and _effects(web, "hourly") == []
    assert [a[3].split(":")[0] for a in web.audit()] == ["refused", "refused"]
    r = await board.post("/jobs/hourly/run", slot=ahead.isoformat(), allow_future="1")
    assert "ran 1" in await _flash(board, r)
    assert len(_effects(web, "hourly")) == 1
    assert web.audit()[-1][3] == "ran 1; --allow-future: 1 slot ahead of the database's clock"


async def test_the_python_api_refuses_future_slots_unless_allowed(web: Web) -> None:
    start = datetime(2031, 1, 1, tzinfo=timezone.utc)
    end = start + timedelta(seconds=30)
    plan = await web.app.backfill_plan("hourly", start, start + 2 * HOUR)
    assert [p.action for p in plan] == ["not due", "not due"]
    with pytest.raises(BadInputError, match="not due yet"):
        await web.app.backfill("hourly", start, end)
    assert _effects(web, "hourly") == []
    ran = await web.app.backfill("hourly", start, end, allow_future=True, actor="ana@ops")
    assert [r.status.value for r in ran] == ["ran"]
    assert [a[3].split(":")[0] for a in web.audit()] == ["refused", "ran 1; --allow-future"]
