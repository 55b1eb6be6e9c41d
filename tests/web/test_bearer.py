"""A script drives the dashboard with `Authorization: Bearer T` alone: no cookie, no CSRF
token, every action through the public API, each audited as the token's actor. A browser's
cookie session still needs its CSRF token; a wrong bearer token is refused (401) and
throttled like a wrong login (429). SQLite and Postgres."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from tests.web.conftest import Web, error_text

from oncely.web.access import LOGIN_FAILURES

TOKEN = "s3cret-for-scripts"
ACTOR = "web:token@127.0.0.1"


@dataclass
class Script:
    """A client that sends the bearer token and never a cookie (it drops those it is given)."""

    client: httpx.AsyncClient

    async def post(self, path: str, **data: Any) -> httpx.Response:
        self.client.cookies.clear()
        r = await self.client.post(path, data=data)
        assert "cookie" not in r.request.headers
        return r


def script(web: Web, token: str = TOKEN) -> Script:
    board = web.board(token=TOKEN, headers={"Authorization": f"Bearer {token}"})
    return Script(board.client)


def _key(web: Web, back: int) -> str:
    return web.last_hour(back).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _dead(web: Web, n: int) -> list[int]:
    ids = []
    for i in range(n):
        rec = await web.app.tasks.get("charge").enqueue_committed(web.app.store, order_id=i)
        ids.append(rec.id)
    with web.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE oncely_tasks SET state = 'dead', error = 'Timeout: x'")
    return ids


async def test_every_action_with_only_a_bearer_token_takes_effect_as_its_actor(web: Web) -> None:
    s = script(web)

    async def ok(path: str, **data: Any) -> None:
        r = await s.post(path, **data)
        assert r.status_code == 303, (path, r.status_code, r.text[-600:])

    await ok("/jobs/hourly/pause", reason="maintenance")
    assert web.rows("SELECT job, paused_by FROM oncely_pauses") == [("hourly", ACTOR)]
    await ok("/jobs/hourly/resume")
    assert web.rows("SELECT resumed_by FROM oncely_pauses") == [(ACTOR,)]
    await ok("/jobs/hourly/run", slot=web.last_hour(3).isoformat())
    await ok(
        "/jobs/hourly/backfill",
        start=web.last_hour(6).isoformat(),
        end=web.last_hour(4).isoformat(),
        apply="1",
    )
    runs = "SELECT key FROM oncely_runs WHERE job = 'hourly' ORDER BY key"
    assert [k for (k,) in web.rows(runs)] == [_key(web, 6), _key(web, 5), _key(web, 3)]
    await ok("/jobs/hourly/release", key=_key(web, 3))
    assert [k for (k,) in web.rows(runs)] == [_key(web, 6), _key(web, 5)]
    r = await s.post("/jobs/hourly/cancel")  # reaches the API, which finds nothing running
    assert r.status_code == 400 and "CSRF" not in error_text(r.text)

    a, b, c = await _dead(web, 3)
    await ok(f"/tasks/{a}/retry")
    await ok(f"/tasks/{b}/discard")
    await ok(f"/tasks/{a}/cancel")
    await ok("/tasks/bulk", action="retry", state="dead", confirm="1")
    assert dict(web.rows("SELECT id, state FROM oncely_tasks")) == {
        a: "discarded", b: "discarded", c: "available"
    }  # fmt: skip

    await ok("/schedules", name="acme", every="1h", target="task:send_receipt",
             args='{"order_id": 1}')  # fmt: skip
    await ok("/schedules/acme/edit", every="2h", target="task:send_receipt",
             args='{"order_id": 1}', version="1")  # fmt: skip
    assert web.rows("SELECT every_seconds FROM oncely_schedules") == [(7200,)]
    await ok("/schedules/acme/pause", reason="on hold")
    assert web.rows("SELECT state FROM oncely_schedules") == [("paused",)]
    await ok("/schedules/acme/resume")
    assert web.rows("SELECT state FROM oncely_schedules") == [("active",)]
    r = await s.post("/schedules/acme/run")  # reaches the API: no slot is due yet
    assert r.status_code == 400 and "nothing ran" in error_text(r.text)
    await ok("/schedules/acme/remove", confirm="1")
    assert web.rows("SELECT name FROM oncely_schedules") == []

    audit = [(action, actor) for action, _target, actor, _result in web.audit()]
    assert [action for action, _ in audit] == [
        "pause", "resume", "run_slot", "backfill", "release",
        "task_retry", "task_discard", "task_cancel", "task_retry",
        "add", "update", "pause", "resume", "remove",
    ]  # fmt: skip
    assert {actor for _, actor in audit} == {ACTOR}


async def test_a_cookie_session_still_needs_its_csrf_token(web: Web) -> None:
    board = web.board(token=TOKEN)
    assert (await board.post("/login", token=TOKEN)).status_code == 303
    before = web.snapshot()
    r = await board.post("/jobs/hourly/pause", with_csrf=False)
    assert r.status_code == 403 and "CSRF" in error_text(r.text)
    both = {"Authorization": f"Bearer {TOKEN}"}  # a cookie and the token: a browser's request
    r = await board.client.post("/jobs/hourly/pause", data={}, headers=both)
    assert r.status_code == 403 and "CSRF" in error_text(r.text)
    other = {**both, "Sec-Fetch-Site": "cross-site"}
    board.client.cookies.clear()
    r = await board.client.post("/jobs/hourly/pause", data={}, headers=other)
    assert r.status_code == 403 and "another origin" in error_text(r.text)
    assert web.snapshot() == before


async def test_a_wrong_bearer_token_is_refused_and_throttled(web: Web) -> None:
    before = web.snapshot()
    wrong = script(web, "guess")
    for _ in range(LOGIN_FAILURES):
        r = await wrong.post("/jobs/hourly/pause")
        assert r.status_code == 401 and "wrong bearer token" in error_text(r.text)
    r = await wrong.post("/jobs/hourly/pause")
    assert r.status_code == 429
    right = Script(wrong.client)  # the same client address, now with the right token
    right.client.headers["Authorization"] = f"Bearer {TOKEN}"
    r = await right.post("/jobs/hourly/pause")
    assert r.status_code == 429 and "too many wrong tokens" in error_text(r.text)
    assert web.snapshot() == before
