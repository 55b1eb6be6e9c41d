"""The dashboard's data schedules: the list (name, expression in words, zone, target, state,
next slot, last run and outcome), adding, editing, pausing, resuming, removing (after a
confirmation) and running the due slot once. Each change goes through `app.schedules` with
the resolver's actor (its audit row); bad input shows the form again with the one-line
error and changes nothing; without permission, CSRF token or same origin, nothing changes;
a read-only dashboard shows no form. SQLite and Postgres."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import sqlalchemy as sa
from tests.web.conftest import Board, Web, allow_all, attrs, error_text

from oncely.web import Grant, schedule_rows
from oncely.web import schedules as schedules_module


def _ana(_request: Any) -> Grant:
    return Grant("all", actor="ana@ops")


def everything(web: Web) -> dict[str, list[Any]]:
    """Every row of every oncely table (the schedules' included): to check nothing changed."""
    with web.engine.connect() as conn:
        names = sorted(n for n in sa.inspect(conn).get_table_names() if n.startswith("oncely_"))
        return {
            n: sorted(tuple(map(str, row)) for row in conn.exec_driver_sql(f"SELECT * FROM {n}"))
            for n in names
        }


def audit(web: Web) -> list[tuple[str, str, str]]:
    """The schedules' audit rows: (action, job, actor)."""
    return [
        (a, j, who)
        for a, j, who in web.rows("SELECT action, job, actor FROM oncely_audit ORDER BY id")
        if j is not None and j.startswith("schedule:")
    ]


def stored(web: Web) -> dict[str, tuple[Any, ...]]:
    return {
        r[0]: tuple(r[1:])
        for r in web.rows(
            "SELECT name, cron, every_seconds, tz, target_kind, target, state, version "
            "FROM oncely_schedules"
        )
    }


async def due(web: Web, name: str, limit: float = 10.0) -> None:
    """Wait (polling the database's clock, with a deadline) until the first slot of the
    schedule `name` has come due: a slot `run_due` may run."""
    record = await web.app.schedules.get(name)
    assert record.next_slot is not None
    end = asyncio.get_running_loop().time() + limit
    while await web.app.store.database_time() < record.next_slot:
        assert asyncio.get_running_loop().time() < end, f"no slot of {name} came due"
        await asyncio.sleep(0.05)


async def _flash(board: Board, response: Any) -> str:
    assert response.status_code == 303, response.text
    landed = await board.client.get(response.headers["location"])
    assert landed.status_code == 200, landed.text
    (flash,) = landed.text.split('data-testid="flash" role="status">', 1)[1:]
    return flash.split("</div>", 1)[0]


NEW = {
    "name": "digest-acme",
    "cron": "0 9 * * *",
    "tz": "Europe/Madrid",
    "target": "task:send_receipt",
    "args": '{"order_id": 7}',
    "catch_up": "latest",
    "overlap": "skip",
}


async def test_the_list_shows_each_schedule_in_words_with_its_state_next_slot_and_last_run(
    web: Web,
) -> None:
    app = web.app
    await app.schedules.add(
        "digest-acme", cron="0 9 * * *", tz="Europe/Madrid", task="send_receipt",
        args={"order_id": 7},
    )  # fmt: skip
    await app.schedules.add("ping", every="1s", task="send_receipt", args={"order_id": 1})
    await app.schedules.add("quiet", every="15m", task="charge", args={"order_id": 2}, paused=True)
    board = web.board()
    html = (await board.get("/schedules")).text
    assert attrs(html, "schedule-row", "data-schedule") == ["digest-acme", "ping", "quiet"]
    assert attrs(html, "schedule-row", "data-state") == ["active", "active", "paused"]
    assert attrs(html, "schedule-count", "data-count") == ["3"]
    row = html.split('data-schedule="digest-acme"', 1)[1].split("</tr>", 1)[0]
    assert "every day at 09:00" in row and "Europe/Madrid" in row and "send_receipt" in row
    record = await app.schedules.get("digest-acme")
    assert record.next_slot is not None
    assert record.next_slot.isoformat(timespec="seconds") in row
    assert "never" in row  # no run yet

    await due(web, "ping")
    result = await app.schedules.run_due("ping")
    assert result.status.value == "ran"
    html = (await board.get("/schedules")).text
    row = html.split('data-schedule="ping"', 1)[1].split("</tr>", 1)[0]
    assert "never" not in row
    assert result.slot is not None and result.slot.isoformat(timespec="seconds") in row

    overview = (await board.get("/")).text  # the overview lists them too
    assert attrs(overview, "schedule-row", "data-schedule") == ["digest-acme", "ping", "quiet"]


async def test_the_add_form_adds_a_schedule_audited_as_the_resolvers_actor(web: Web) -> None:
    board = web.board(permissions=_ana)
    html = (await board.get("/schedules")).text
    assert len(attrs(html, "add-form")) == 1
    r = await board.post("/schedules", **NEW)
    assert r.headers["location"] == "/schedules/digest-acme"
    assert "added digest-acme" in await _flash(board, r)
    assert stored(web) == {
        "digest-acme": (
            "0 9 * * *", None, "Europe/Madrid", "task", "send_receipt", "active", 1
        )
    }  # fmt: skip
    record = await web.app.schedules.get("digest-acme")
    assert record.args == {"order_id": 7} and record.changed_by == "ana@ops"
    assert audit(web) == [("add", "schedule:digest-acme", "ana@ops")]

    r = await board.post("/schedules", **{**NEW, "name": "held", "paused": "1"})
    assert "(paused)" in await _flash(board, r)
    assert stored(web)["held"][-2] == "paused"


BAD = [
    ({"cron": "61 * * * *"}, "61"),
    ({"tz": "Mars/Olympus_Mons"}, "Mars/Olympus_Mons"),
    ({"target": "task:nope"}, "nope"),
    ({"args": "{"}, "args"),
    ({"args": "[1, 2]"}, "args"),
    ({"args": '{"order_id": 1, "colour": "red"}'}, "colour"),
    ({"name": "hourly"}, "hourly"),
    ({"name": "taken"}, "taken"),
    ({"cron": "", "every": "0s"}, "0s"),
    ({"cron": "", "every": "soon"}, "soon"),
    ({"cron": ""}, "cron expression or an interval"),
    ({"every": "15m"}, "not both"),
    ({"target": "queue:x"}, "target"),
    ({"catch_up": "sometimes"}, "catch_up"),
    ({"grace": "-5"}, "grace"),
    ({"timeout": "a while"}, "timeout"),
    ({"name": ""}, "name"),
    ({"tz": "A" * 10_000}, "longer than 64 characters"),
    ({"args": json.dumps({"order_id": 1, "note": "x" * 65_536})}, "64 KiB"),
    ({"name": "schedule:taken"}, "starts with 'schedule:'"),
]


@pytest.mark.parametrize("change,says", BAD, ids=[str(c)[:60] for c, _ in BAD])
async def test_bad_form_input_shows_the_one_line_error_and_changes_nothing(
    web: Web, change: dict[str, str], says: str
) -> None:
    await web.app.schedules.add("taken", every="1h", task="send_receipt", args={"order_id": 1})
    board = web.board(permissions=_ana)
    before = everything(web)
    sent = {**NEW, **change}
    r = await board.post("/schedules", **sent)
    assert r.status_code == 400, r.text
    message = error_text(r.text)
    assert "\n" not in message.strip() and "Traceback" not in r.text
    assert says in message and "nothing changed" in message
    assert everything(web) == before
    for field in ("name", "cron", "tz"):  # the form comes back as it was sent
        assert f'value="{sent[field]}"' in r.text.replace('data-testid="field-', "")


async def test_editing_changes_what_the_form_changed_and_refuses_a_stale_form(web: Web) -> None:
    board = web.board(permissions=_ana)
    await board.post("/schedules", **NEW)
    page = (await board.get("/schedules/digest-acme")).text
    assert attrs(page, "schedule-name", "data-version") == ["1"]
    form = {**NEW, "version": "1"}
    del form["name"]
    r = await board.post("/schedules/digest-acme/edit", **{**form, "cron": "30 18 * * FRI"})
    assert "changed digest-acme (cron)" in await _flash(board, r)
    assert stored(web)["digest-acme"][0] == "30 18 * * FRI"
    assert stored(web)["digest-acme"][-1] == 2
    assert audit(web)[-1] == ("update", "schedule:digest-acme", "ana@ops")

    before = everything(web)
    r = await board.post("/schedules/digest-acme/edit", **{**form, "tz": "Asia/Tokyo"})
    assert r.status_code == 400 and "was changed since" in error_text(r.text)
    r = await board.post(
        "/schedules/digest-acme/edit", **{**form, "version": "2", "tz": "Nowhere/Land"}
    )
    assert r.status_code == 400 and "Nowhere/Land" in error_text(r.text)
    assert 'value="Nowhere/Land"' in r.text  # the form as sent, to correct
    assert everything(web) == before

    r = await board.post(
        "/schedules/digest-acme/edit",
        **{**form, "version": "2", "cron": "", "every": "15m", "grace": "90", "timeout": "5m"},
    )
    assert "changed digest-acme (cron, every, grace, timeout)" in await _flash(board, r)
    assert stored(web)["digest-acme"][:2] == (None, 900.0)
    record = await web.app.schedules.get("digest-acme")
    assert (record.grace, record.timeout, record.version) == (90.0, 300.0, 3)
    page = (await board.get("/schedules/digest-acme")).text
    for field, shown in (("every", "15m"), ("grace", "90s"), ("timeout", "5m")):
        assert f'name="{field}" value="{shown}"' in page, field
    r = await board.post(  # cleared: no grace, no timeout
        "/schedules/digest-acme/edit",
        **{**form, "version": "3", "cron": "", "every": "15m", "grace": "", "timeout": ""},
    )
    assert "changed digest-acme (grace, timeout)" in await _flash(board, r)
    record = await web.app.schedules.get("digest-acme")
    assert (record.grace, record.timeout) == (None, None)


async def test_pause_resume_run_and_remove_go_through_the_api_audited(web: Web) -> None:
    board = web.board(permissions=_ana)
    await web.app.schedules.add("ping", every="1s", task="send_receipt", args={"order_id": 1})
    html = (await board.get("/schedules/ping")).text
    for form in ("pause-form", "run-form", "remove-form", "edit-form"):
        assert len(attrs(html, form)) == 1, form

    r = await board.post("/schedules/ping/pause", reason="customer left")
    assert "paused ping" in await _flash(board, r)
    record = await web.app.schedules.get("ping")
    assert (record.state, record.pause_reason) == ("paused", "customer left")
    html = (await board.get("/schedules/ping")).text
    assert len(attrs(html, "resume-form")) == 1 and attrs(html, "pause-form") == []
    r = await board.post("/schedules/ping/resume")
    assert "resumed ping" in await _flash(board, r)
    assert (await web.app.schedules.get("ping")).state == "active"

    await due(web, "ping")
    r = await board.post("/schedules/ping/run")
    first = await _flash(board, r)
    assert ": ran" in first
    claims = web.rows("SELECT key FROM oncely_runs WHERE job = 'schedule:ping'")
    assert len(claims) >= 1

    before = everything(web)
    r = await board.post("/schedules/ping/remove")  # the confirmation: nothing changes
    assert r.status_code == 200 and len(attrs(r.text, "remove-yes")) == 1
    assert everything(web) == before
    r = await board.post("/schedules/ping/remove", confirm="1")
    assert r.headers["location"] == "/schedules"
    assert "removed ping" in await _flash(board, r)
    assert stored(web) == {}
    assert audit(web)[0][0] == "add"  # by the API, as its default actor
    assert audit(web)[1:] == [
        (action, "schedule:ping", "ana@ops") for action in ("pause", "resume", "run_slot", "remove")
    ]


async def test_running_the_due_slot_twice_runs_it_once(web: Web) -> None:
    board = web.board(permissions=_ana)
    # Every 4 s: the two runs below fall in the one slot that came due (with 1 s, the next
    # slot could come due between them on a loaded machine, and the second would run it).
    await web.app.schedules.add("report", every="4s", task="send_receipt",
                                args={"order_id": 3})  # fmt: skip
    r = await board.post("/schedules/report/run")  # nothing due since it was added
    assert r.status_code == 400 and "nothing ran" in error_text(r.text)
    await due(web, "report")
    r = await board.post("/schedules/report/run")
    assert ": ran" in await _flash(board, r)
    r = await board.post("/schedules/report/run")
    assert "already ran" in await _flash(board, r)
    assert len(web.rows("SELECT key FROM oncely_runs WHERE job = 'schedule:report'")) == 1
    tasks = web.rows("SELECT task FROM oncely_tasks")
    assert tasks == [("send_receipt",)]  # the slot's task, enqueued once


ROUTES = [
    ("/schedules", dict(NEW, name="fresh")),
    ("/schedules/ping/edit", {**NEW, "cron": "5 * * * *"}),
    ("/schedules/ping/pause", {}),
    ("/schedules/ping/resume", {}),
    ("/schedules/ping/run", {}),
    ("/schedules/ping/remove", {"confirm": "1"}),
]


async def _ping(web: Web) -> None:
    await web.app.schedules.add("ping", cron="0 * * * *", task="send_receipt",
                                args={"order_id": 1})  # fmt: skip
    await web.app.schedules.pause("ping")  # something to resume, too


@pytest.mark.parametrize("path,data", ROUTES, ids=[p for p, _ in ROUTES])
async def test_every_schedule_action_needs_permission_csrf_and_the_same_origin(
    web: Web, path: str, data: dict[str, str]
) -> None:
    await _ping(web)
    before = everything(web)
    read_only = web.board()
    r = await read_only.post(path, **data)
    assert r.status_code == 403 and "not allowed" in error_text(r.text)
    board = web.board(permissions=allow_all)
    await board.get("/")
    r = await board.post(path, with_csrf=False, **data)
    assert r.status_code == 403 and "CSRF" in error_text(r.text)
    r = await board.post(path, with_csrf=False, **{**data, "csrf": "forged"})
    assert r.status_code == 403 and "CSRF" in error_text(r.text)
    token = await board.csrf()
    r = await board.client.post(
        path, data={**data, "csrf": token}, headers={"sec-fetch-site": "cross-site"}
    )
    assert r.status_code == 403 and "another origin" in error_text(r.text)
    assert everything(web) == before


async def test_a_set_of_schedule_actions_allows_those_only(web: Web) -> None:
    await _ping(web)
    board = web.board(permissions=lambda _r: Grant({"schedule_resume"}, actor="bo@ops"))
    html = (await board.get("/schedules/ping")).text
    assert len(attrs(html, "resume-form")) == 1
    for absent in ("run-form", "remove-form", "edit-form"):
        assert attrs(html, absent) == [], absent
    assert attrs((await board.get("/schedules")).text, "add-form") == []
    assert (await board.post("/schedules/ping/remove", confirm="1")).status_code == 403
    assert (await board.post("/schedules/ping/resume")).status_code == 303
    assert audit(web)[-1] == ("resume", "schedule:ping", "bo@ops")


async def test_read_only_shows_no_form(web: Web) -> None:
    await _ping(web)
    board = web.board()
    for path in ("/schedules", "/schedules/ping"):
        html = (await board.get(path)).text
        assert len(attrs(html, "read-only")) == 1, path
        assert "<form" not in html.split("<main>", 1)[1], path


async def test_an_unknown_schedule_is_a_404_and_changes_nothing(web: Web) -> None:
    board = web.board(permissions=_ana)
    before = everything(web)
    r = await board.get("/schedules/nope")
    assert r.status_code == 404 and "nope" in error_text(r.text)
    for verb in ("pause", "resume", "run", "remove", "edit"):
        r = await board.post(f"/schedules/nope/{verb}", **NEW, confirm="1")
        assert r.status_code == 404, (verb, r.text)
        assert "nope" in error_text(r.text) and "nothing changed" in error_text(r.text)
    assert everything(web) == before


async def test_the_ledger_names_job_page_is_the_schedules_page(web: Web) -> None:
    await _ping(web)
    board = web.board()
    r = await board.get("/jobs/schedule:ping")
    assert r.status_code == 307 and r.headers["location"] == "/schedules/ping"
    r = await board.get("/jobs/schedule:x%0d%0aSet-Cookie:%20a=b")  # no header of its own
    assert r.status_code == 307 and "set-cookie" not in {k.lower() for k in r.headers}
    assert r.headers["location"] == "/schedules/x%0D%0ASet-Cookie%3A%20a%3Db"
    assert (await board.get(r.headers["location"])).status_code == 400  # not a name
    page = (await board.get("/schedules/ping")).text
    assert attrs(page, "schedule-name", "data-state") == ["paused"]
    assert "schedule:ping" in page


async def test_a_tenants_schedule_name_with_colon_and_dot_round_trips(web: Web) -> None:
    """Per-customer names (`digest:acme.eu`) in the URLs, the forms and the audit filter."""
    board = web.board(permissions=_ana)
    r = await board.post("/schedules", **{**NEW, "name": "digest:acme.eu"})
    assert "added digest:acme.eu" in await _flash(board, r)
    page = (await board.get("/schedules/digest:acme.eu")).text
    assert attrs(page, "schedule-name", "data-schedule") == ["digest:acme.eu"]
    r = await board.post("/schedules/digest:acme.eu/pause")
    assert "paused digest:acme.eu" in await _flash(board, r)
    trail = (await board.get("/audit", job="schedule:digest:acme.eu")).text
    assert attrs(trail, "audit-row", "data-action") == ["pause", "add"]  # newest first
    assert set(attrs(trail, "audit-row", "data-job")) == {"schedule:digest:acme.eu"}
    assert audit(web) == [
        ("add", "schedule:digest:acme.eu", "ana@ops"),
        ("pause", "schedule:digest:acme.eu", "ana@ops"),
    ]


async def test_the_list_pages_by_name(web: Web, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedules_module, "LIST_PAGE", 2)
    monkeypatch.setattr(schedule_rows, "OVERVIEW_ROWS", 1)
    for name in ("c", "a", "b"):
        await web.app.schedules.add(name, every="1h", task="send_receipt", args={"order_id": 1})
    board = web.board()
    html = (await board.get("/schedules")).text
    assert attrs(html, "schedule-row", "data-schedule") == ["a", "b"]
    (more,) = attrs(html, "next-page", "href")
    assert more == "/schedules?after=b"
    html = (await board.get("/schedules", after="b")).text
    assert attrs(html, "schedule-row", "data-schedule") == ["c"]
    assert attrs(html, "next-page") == []
    overview = (await board.get("/")).text
    assert attrs(overview, "schedule-row", "data-schedule") == ["a"]
    assert "the first 1 by name" in overview
