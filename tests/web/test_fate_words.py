"""The job page says what became of each slot in plain words (docs/design/fate.md): a
failed slot waits for its retry with the attempts left, a given-up slot offers the release
and the skip on purpose that settle it, a released slot says who ran it and who released
it, a skip says who and why; a slot that ran and was released asks before it runs a second
time. No outcome's code name is shown as text. SQLite and Postgres."""

from __future__ import annotations

import html as html_lib
import re
from typing import Any

import pytest
from tests.web.conftest import Web, attrs

from oncely import RetryPolicy, every
from oncely.web import Grant

RAW = ("no_worker", "before_job", "given_up", "timed_out", "not_due")


def _ana(_request: Any) -> Grant:
    return Grant("all", actor="ana@ops")


async def _flaky(db: Any, now: Any) -> None:
    raise RuntimeError("the ledger API timed out")


def rows(html: str) -> dict[str, dict[str, str]]:
    """Each slot row of a job page by slot: its label, its sentence, its buttons."""
    found = {}
    for row in re.findall(r'<tr data-testid="slot-row".*?</tr>', html, re.S):
        slot = re.search(r'data-slot="([^"]+)"', row)
        assert slot is not None
        found[slot.group(1)] = {
            "label": text(row.split('data-testid="slot-label">', 1)[1].split("</td>", 1)[0]),
            "why": text(row.split('data-testid="explain">', 1)[1].split("</td>", 1)[0]),
            "buttons": " ".join(re.findall(r'<button[^>]*data-testid="([^"]+)"', row)),
            "again": "true" if 'data-again="true"' in row else "",
        }
    return found


def text(fragment: str) -> str:
    """What a person reads of some HTML: its text, not its tags nor their attributes."""
    return " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def iso(t: Any) -> str:
    return str(t.isoformat(timespec="seconds"))


async def test_each_slot_says_its_fate_in_plain_words(web: Web) -> None:
    web.app.job(every(hours=1), name="flaky", retry=RetryPolicy(attempts=3, wait=7200))(_flaky)
    board = web.board(permissions=_ana)
    failed, gave_up, released = web.last_hour(2), web.last_hour(3), web.last_hour(4)
    with pytest.raises(RuntimeError):
        await web.app.run("flaky", failed)
    with pytest.raises(RuntimeError):
        await web.app.run("boom", gave_up)
    await web.app.run("hourly", released)
    key = web.app.registry.job("hourly").key_for(released)
    await web.app.release_slot("hourly", key, actor="bo@ops", reason="re-send the invoices")

    flaky = rows((await board.get("/jobs/flaky", n="6")).text)[iso(failed)]
    assert flaky["label"] == "waiting for retry"
    assert re.fullmatch(
        r"waiting for retry at \S+ \(attempt 1 failed; 2 of 3 attempts left\): "
        r"RuntimeError: the ledger API timed out",
        flaky["why"],
    ), flaky

    page = (await board.get("/jobs/boom", n="6")).text
    boom = rows(page)[iso(gave_up)]
    assert boom["label"] == "given up"
    assert boom["why"].startswith("given up after 1 attempt (the last one, by "), boom
    assert "releases it (it runs again) or skips it on purpose" in boom["why"]
    assert boom["buttons"] == "release skip"  # what settles it; no Run
    gave_up_key = web.app.registry.job("boom").key_for(gave_up)
    r = await board.post("/jobs/boom/skip", key=gave_up_key, reason="the tax API is retired")
    assert r.status_code == 303, r.text
    boom = rows((await board.get("/jobs/boom", n="6")).text)[iso(gave_up)]
    assert boom["label"] == "skipped on purpose"
    assert re.fullmatch(
        r"skipped on purpose by ana@ops at \S+: the tax API is retired", boom["why"]
    ), boom

    page = (await board.get("/jobs/hourly", n="6")).text
    hourly = rows(page)[iso(released)]
    assert hourly["label"] == "released"
    assert re.fullmatch(
        r"ran at \S+ by \S+; released by bo@ops at \S+ \(re-send the invoices\): "
        r"it may run again",
        hourly["why"],
    ), hourly
    assert "before the job" not in hourly["why"] and hourly["again"] == "true"
    for shown in (page, (await board.get("/jobs/boom", n="6")).text):
        seen = text(shown.split("<main>", 1)[1])
        assert [w for w in RAW if w in seen] == [], seen

    claims = "SELECT key FROM oncely_runs WHERE job = 'hourly'"
    asked = await board.post("/jobs/hourly/run", slot=iso(released))
    assert asked.status_code == 200
    assert "a second time" in text(asked.text.split('data-testid="run-confirm"', 1)[1])
    assert len(attrs(asked.text, "run-yes")) == 1
    assert web.rows(claims) == []  # asked, not run
    r = await board.post("/jobs/hourly/run", slot=iso(released), confirm="1")
    assert r.status_code == 303
    assert web.rows(claims) == [(key,)]
    audit = [(a[0], a[2]) for a in web.audit()]
    assert audit == [
        ("release", "bo@ops"),
        ("skip", "ana@ops"),
        ("run_slot", "ana@ops"),
    ]
