"""The worker runs the schedules kept as data: a schedule added while it runs fires, each
slot claimed once with its task enqueued in the claim's transaction; a removed schedule's
slot is not run; a schedule whose target this release does not register is reported
(`schedule.unrunnable`) and left due, its slot not claimed; `--schedule-poll 0` runs none."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from tests.schedules.conftest import APP, fresh_app, migrate, rows, until
from tests.support import engine_for, start_cli, stop, wait_until

from oncely import Oncely, events


def claims(db_url: str, name: str) -> list[str]:
    found = rows(db_url, "SELECT key FROM oncely_runs WHERE job = :j ORDER BY key", j=name)
    return [k for (k,) in found]


async def test_a_schedule_added_while_the_worker_runs_fires_each_slot_once(
    app: Oncely, db_url: str
) -> None:
    async with app.worker(schedule_poll=0.2, concurrency=2):
        await app.schedules.add("acme", every="1s", task="digest", args={"tenant": "acme"})
        await until(lambda: len(claims(db_url, "schedule:acme")) >= 3, "three slots")
        await until(lambda: len(rows(db_url, "SELECT * FROM effects")) >= 3, "three tasks run")
    keys = claims(db_url, "schedule:acme")
    tasks = rows(db_url, "SELECT idempotency_key FROM oncely_tasks ORDER BY idempotency_key")
    assert [k for (k,) in tasks] == [f"schedule:acme:{key}" for key in keys]
    rec = await app.schedules.get("acme")
    assert rec.next_slot is not None and rec.next_slot.strftime("%Y-%m-%dT%H:%M:%SZ") > keys[-1]


def execute(db_url: str, statement: str, **params: Any) -> None:
    """One write with plain SQL, committed (what a release that changed would leave)."""
    engine = engine_for(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement), params)
    finally:
        engine.dispose()


def _slots(db_url: str, job: str) -> list[datetime]:
    found = rows(db_url, "SELECT scheduled_for FROM oncely_runs WHERE job = :j", j=job)
    return [_aware(s) for (s,) in found]


def _aware(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


async def test_a_schedule_whose_target_is_gone_is_reported_and_its_slot_not_claimed(
    app: Oncely, db_url: str
) -> None:
    gone = await app.schedules.add("acme", every="1s", task="digest", args={"tenant": "acme"})
    await app.schedules.add("other", every="1s", task="digest", args={"tenant": "other"})
    execute(db_url, "UPDATE oncely_schedules SET target = 'gone' WHERE name = 'acme'")
    seen: list[Mapping[str, Any]] = []

    def observe(event: str, fields: Mapping[str, Any]) -> None:
        if event == "schedule.unrunnable":
            seen.append(fields)

    events.subscribe(observe)
    try:
        async with app.worker(schedule_poll=0.2, concurrency=0):
            await until(lambda: bool(seen), "the schedule.unrunnable event")
            assert gone.next_slot is not None
            await until(
                lambda: any(s > gone.next_slot for s in _slots(db_url, "schedule:other")),  # type: ignore[operator]
                "a slot of the other schedule after the unrunnable one's",
            )
    finally:
        events.unsubscribe(observe)
    assert seen[0]["job"] == "schedule:acme" and "'gone'" in seen[0]["error"]
    assert claims(db_url, "schedule:acme") == []
    assert (await app.schedules.get("acme")).next_slot == gone.next_slot  # left due, for others
    assert (
        rows(db_url, "SELECT * FROM oncely_tasks WHERE idempotency_key LIKE 'schedule:acme:%'")
        == []
    )


async def test_a_removed_schedule_s_slot_is_not_run(app: Oncely, db_url: str) -> None:
    removed = await app.schedules.add("acme", every="1s", task="digest", args={"tenant": "acme"})
    await app.schedules.add("other", every="1s", task="digest", args={"tenant": "other"})
    await app.schedules.remove("acme")
    assert removed.next_slot is not None
    async with app.worker(schedule_poll=0.2, concurrency=1):
        await until(
            lambda: any(s > removed.next_slot for s in _slots(db_url, "schedule:other")),  # type: ignore[operator]
            "a slot of the other schedule after the removed one's",
        )
        await until(lambda: len(rows(db_url, "SELECT * FROM effects")) >= 1, "a task run")
    assert claims(db_url, "schedule:acme") == []
    assert rows(db_url, "SELECT arg FROM effects WHERE arg = 'acme'") == []


def test_a_worker_with_schedule_poll_0_runs_no_data_schedule(db_url: str, tmp_path: Path) -> None:
    migrate(db_url)
    app = fresh_app(db_url)
    rec = app.schedules.add_sync("acme", every="1s", task="digest", args={"tenant": "acme"})
    assert rec.next_slot is not None
    worker = start_cli(
        "--app", f"{APP}:app", "worker", "--schedule-poll", "0",
        env={"ONCELY_DATABASE_URL": db_url},
        log=tmp_path / "worker.log",
    )  # fmt: skip
    try:
        # The worker runs tasks meanwhile: one enqueued after the schedule's first slot runs.
        wait_until(lambda: _db_now(db_url) > rec.next_slot + timedelta(seconds=2), "two slots")  # type: ignore[operator]
        _enqueue(db_url, "direct")
        wait_until(
            lambda: rows(db_url, "SELECT arg FROM effects") == [("direct",)],
            "the enqueued task to run",
            log=tmp_path / "worker.log",
        )
    finally:
        code, _ = stop(worker)
    assert code == 0, (tmp_path / "worker.log").read_text()
    assert claims(db_url, "schedule:acme") == []
    assert (app.schedules.get_sync("acme")).next_slot == rec.next_slot


def _enqueue(db_url: str, tenant: str) -> None:
    async def go() -> None:
        application = fresh_app(db_url)
        try:
            task = importlib.import_module(APP).digest
            await task.enqueue_committed(application.store, tenant=tenant)
        finally:
            await application.aclose()

    asyncio.run(go())


def _db_now(db_url: str) -> datetime:
    if db_url.startswith("postgres"):
        return _aware(rows(db_url, "SELECT clock_timestamp()")[0][0])
    return datetime.now(timezone.utc)


@pytest.mark.parametrize("change", ["remove", "update"])
async def test_a_schedule_changed_between_the_workers_read_and_its_claim_runs_no_stale_slot(
    app: Oncely, db_url: str, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The window the fleet found: a worker reads a due row, an operator removes the schedule
    (or changes its interval) before the worker's claim; the attempt's compare-and-set of the
    next slot, in its own transaction, finds the row gone or moved and starts nothing."""
    added = await app.schedules.add("acme", every="1s", task="digest", args={"tenant": "acme"})
    assert added.next_slot is not None
    stale = added.next_slot.strftime("%Y-%m-%dT%H:%M:%SZ")
    real = app.store.schedules.still_due
    changed: list[str] = []

    async def then_changed(name: str, expected: datetime) -> bool:
        answer = await real(name, expected)
        if not changed:  # once, right after the worker's read and before its attempt
            if change == "remove":
                await app.schedules.remove(name)
            else:
                await app.schedules.update(name, every="1h")
            changed.append(name)
        return answer

    monkeypatch.setattr(app.store.schedules, "still_due", then_changed)
    ended: list[tuple[str, Mapping[str, Any]]] = []

    def observe(event: str, fields: Mapping[str, Any]) -> None:
        if event.startswith("run.") and fields.get("job") == "schedule:acme":
            ended.append((event, fields))

    events.subscribe(observe)
    try:
        async with app.worker(schedule_poll=0.2, concurrency=2):
            await until(lambda: bool(ended), "the stale slot's attempt")
    finally:
        events.unsubscribe(observe)
    assert changed == ["acme"]
    assert (ended[0][0], ended[0][1]["key"]) == ("run.skipped", stale)
    assert stale not in claims(db_url, "schedule:acme")
    tasks = rows(db_url, "SELECT idempotency_key FROM oncely_tasks")
    assert f"schedule:acme:{stale}" not in {k for (k,) in tasks}
