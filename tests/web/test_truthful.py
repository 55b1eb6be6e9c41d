"""The pages offer only what can be done: a read-only dashboard shows no action button and
says why; a task shows the actions its state allows; a resolver's set of actions shows
those and no other."""

from __future__ import annotations

from typing import Any

import pytest
from tests.web.conftest import Web, allow_all, attrs

from oncely.model import TaskState
from oncely.web import Grant

JOB_BUTTONS = ("pause", "resume", "run-now", "backfill-preview", "cancel", "release", "run-slot")
TASK_BUTTONS = ("retry", "discard", "cancel")


async def _one_task(web: Web, state: str) -> int:
    rec = await web.app.tasks.get("charge").enqueue_committed(web.app.store, order_id=1)
    with web.engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE oncely_tasks SET state = '{state}' WHERE id = {rec.id}")
    return rec.id


@pytest.mark.parametrize(("token", "why"), [(None, "allows none"), ("t0ken", "not logged in")])
async def test_read_only_hides_every_action_and_says_why(
    web: Web, token: str | None, why: str
) -> None:
    await web.app.run("hourly", web.last_hour(2))
    task_id = await _one_task(web, "dead")
    board = web.board(token=token)
    job = (await board.get("/jobs/hourly")).text
    assert [b for b in JOB_BUTTONS if attrs(job, b)] == []
    assert '<form method="post"' not in job
    task = (await board.get(f"/tasks/{task_id}")).text
    tasks = (await board.get("/tasks")).text
    for html in (job, task, tasks):
        assert len(attrs(html, "read-only")) == 1 and why in html
    assert [b for b in TASK_BUTTONS if attrs(task, b)] == []
    assert attrs(tasks, "bulk") == []
    acting = (await web.board(permissions=allow_all).get("/jobs/hourly")).text
    assert attrs(acting, "read-only") == []
    assert attrs(acting, "pause") and attrs(acting, "run-now") and attrs(acting, "release")


@pytest.mark.parametrize(
    ("state", "buttons"),
    [
        ("available", ["retry", "discard", "cancel"]),
        ("running", ["discard", "cancel"]),
        ("succeeded", []),
        ("discarded", ["retry"]),
        ("dead", ["retry", "discard"]),
    ],
)
async def test_a_task_offers_the_actions_its_state_allows(
    web: Web, state: str, buttons: list[str]
) -> None:
    assert {s.value for s in TaskState} >= {state}
    task_id = await _one_task(web, state)
    board = web.board(permissions=allow_all)
    html = (await board.get(f"/tasks/{task_id}")).text
    assert [b for b in TASK_BUTTONS if attrs(html, b)] == buttons
    if not buttons:
        assert len(attrs(html, "no-task-actions")) == 1
    for b in TASK_BUTTONS:  # what is not offered, the API refuses too: nothing changes
        if b in buttons or state == "running":
            continue
        before = web.snapshot()
        r = await board.post(f"/tasks/{task_id}/{b}")
        assert r.status_code == 400, (b, r.status_code)
        assert web.snapshot()["oncely_tasks"] == before["oncely_tasks"]


async def test_a_resolvers_set_of_actions_shows_those_buttons_only(web: Web) -> None:
    def pauser(_request: Any) -> Grant:
        return Grant({"pause", "task_retry"}, actor="ana@ops")

    task_id = await _one_task(web, "dead")
    board = web.board(permissions=pauser)
    job = (await board.get("/jobs/hourly")).text
    assert [b for b in JOB_BUTTONS if attrs(job, b)] == ["pause"]
    task = (await board.get(f"/tasks/{task_id}")).text
    assert [b for b in TASK_BUTTONS if attrs(task, b)] == ["retry"]
    tasks = (await board.get("/tasks")).text
    assert attrs(tasks, "bulk-action") and 'value="discard"' not in tasks
