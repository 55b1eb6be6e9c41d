"""`app.worker()` and `app.work()` inside an application's own event loop, with the events
a metrics module sees; and the note of a slot not started, tried again when the database
refuses it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from tests.conftest import _reset_postgres, _sync_url

from oncely import Oncely, events, every
from oncely.clock import utcnow

Seen = list[tuple[str, dict[str, Any]]]


@pytest.fixture
def seen() -> Iterator[Seen]:
    got: Seen = []

    def observer(event: str, fields: Mapping[str, Any]) -> None:
        got.append((event, dict(fields)))

    events.subscribe(observer)
    yield got
    events.unsubscribe(observer)


async def eventually(predicate: Callable[[], bool], deadline: float = 20.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {deadline}s")


def named(seen: Seen, event: str, job: str | None = None) -> list[dict[str, Any]]:
    return [f for e, f in seen if e == event and (job is None or f.get("job") == job)]


async def test_a_failing_job_never_stops_the_loop(db_url: str, seen: Seen) -> None:
    app = Oncely(db_url)

    @app.job(every(seconds=1))
    async def good(db, now):  # type: ignore[no-untyped-def]
        return None

    @app.job(every(seconds=1))
    async def bad(db, now):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    await app.migrate()
    async with app.worker():
        await eventually(
            lambda: (
                len(named(seen, "run.ran", "good")) >= 2
                and len(named(seen, "run.failed", "bad")) >= 2
            )
        )
    await app.aclose()
    ran = named(seen, "run.ran", "good")[0]
    assert set(ran) >= {"job", "key", "slot", "replica", "duration_ms", "latency_ms"}
    assert 0 <= ran["latency_ms"] < 1000
    assert "RuntimeError: boom" in named(seen, "run.failed", "bad")[0]["error"]
    [started] = named(seen, "worker.started")
    [stopped] = named(seen, "worker.shutdown")
    assert started["jobs"] == 2 and stopped["cancelled"] == 0
    assert [e for e, _ in seen].index("worker.shutdown") == len(seen) - 1  # nothing after


async def test_catch_up_latest_runs_the_newest_missed_slot_from_the_ledger(
    db_url: str, seen: Seen
) -> None:
    app = Oncely(db_url)
    calls: list[Any] = []

    @app.job(every(seconds=1))
    async def report(db, now):  # type: ignore[no-untyped-def]
        calls.append(now)

    await app.migrate()
    # The last claim was 30 s ago: the workers were all down since.
    assert (await app.run("report", utcnow() - timedelta(seconds=30))).status.value == "ran"
    calls.clear()
    async with app.worker():
        await eventually(lambda: len(calls) >= 1 and bool(named(seen, "run.missed")))
    await app.aclose()
    [missed] = named(seen, "run.missed")
    assert missed["reason"] == "catch_up" and 28 <= missed["count"] <= 31, missed
    assert missed["job"] == "report" and missed["catch_up"] == "latest"
    first_run = calls[0]
    assert utcnow() - first_run < timedelta(seconds=3)  # the newest, not the oldest


async def test_work_stops_on_its_event_and_only_runs_the_chosen_jobs(
    db_url: str, seen: Seen
) -> None:
    app = Oncely(db_url)

    @app.job(every(seconds=1))
    async def chosen(db, now):  # type: ignore[no-untyped-def]
        return None

    @app.job(every(seconds=1))
    async def other(db, now):  # type: ignore[no-untyped-def]
        return None

    await app.migrate()
    stopping = asyncio.Event()
    task = asyncio.create_task(app.work(jobs=["chosen"], stopping=stopping))
    await eventually(lambda: bool(named(seen, "run.ran", "chosen")))
    stopping.set()
    await asyncio.wait_for(task, 10)
    await app.aclose()
    assert named(seen, "run.ran", "other") == []
    assert named(seen, "worker.shutdown")


async def test_overlap_skip_never_runs_two_slots_of_a_job_at_once(db_url: str, seen: Seen) -> None:
    app = Oncely(db_url)
    running: list[Any] = []
    most = 0

    @app.job(every(seconds=1))
    async def slow(db, now):  # type: ignore[no-untyped-def]
        nonlocal most
        running.append(now)
        most = max(most, len(running))
        await asyncio.sleep(1.6)  # always still running when the next slot comes due
        running.remove(now)

    await app.migrate()
    async with app.worker():
        await eventually(
            lambda: (
                len(named(seen, "run.ran", "slow")) >= 2
                and len(named(seen, "run.overlap_skipped", "slow")) >= 2
            )
        )
    await app.aclose()
    assert most == 1
    skipped = named(seen, "run.overlap_skipped", "slow")[0]
    assert set(skipped) >= {"job", "key", "slot", "running", "replica"}
    ran_slots = {f["slot"] for f in named(seen, "run.ran", "slow")}
    assert not ran_slots & {f["slot"] for f in named(seen, "run.overlap_skipped")}


async def test_a_driver_error_before_the_job_ran_leaves_the_slot_to_a_retry(
    db_url: str, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error of the attempt's machinery that escaped the store (asyncpg's "cannot switch
    to state …" after a stall) is not the slot's fate: the worker tries the slot again, as
    after a busy answer, and it runs once. Only a failing key function gives a slot up."""
    import oncely.work.jobs as jobs_module

    real = jobs_module.run_slot
    failed: list[str] = []

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(args[3])  # the key of the first slot this worker attempts
            raise RuntimeError("cannot switch to state 15; another operation is in progress")
        return await real(*args, **kwargs)

    monkeypatch.setattr(jobs_module, "run_slot", flaky)
    app = Oncely(db_url)

    @app.job(every(seconds=1))
    async def tick(db, now):  # type: ignore[no-untyped-def]
        return None

    await app.migrate()
    async with app.worker():
        await eventually(lambda: bool(failed) and failed[0] in ran_keys(seen, "tick"))
    await app.aclose()
    [error] = named(seen, "worker.attempt_error", "tick")
    assert error["key"] == failed[0] and "cannot switch to state" in error["error"]
    assert ran_keys(seen, "tick").count(failed[0]) == 1


def ran_keys(seen: Seen, job: str) -> list[str]:
    return [f["key"] for f in named(seen, "run.ran", job)]


# -- a slot's note the database refuses ------------------------------------------------------

REFUSE = [
    "CREATE SEQUENCE note_refusals",
    """
    CREATE FUNCTION refuse_note() RETURNS trigger AS $$
    BEGIN
        -- a sequence counts the tries: its value survives the refused insert's rollback
        IF nextval('note_refusals') <= {refusals:d} THEN
            RAISE EXCEPTION 'note refused by the test';
        END IF;
        RETURN NEW;
    END;
    $$ LANGUAGE plpgsql
    """,
    "CREATE TRIGGER refuse_note BEFORE INSERT ON oncely_attempts FOR EACH ROW"
    " WHEN (NEW.outcome = 'overlap') EXECUTE FUNCTION refuse_note()",
]


def overlap_notes(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT key FROM oncely_attempts WHERE job = 'slow' AND outcome = 'overlap'"
        )
        return {key for (key,) in rows}


@pytest.mark.postgres
@pytest.mark.parametrize("refusals", [2, 1_000_000])
async def test_an_overlap_note_the_database_refuses_is_tried_again(
    postgres_database: str, seen: Seen, refusals: int
) -> None:
    """The note of a slot the worker did not start (an overlap) is written even when the
    database refuses its first tries: the worker tries again, backing off; past its tries it
    says so (`run.note_failed`). The refusals are the database's own: a trigger raises for the
    first N inserts of an overlap note."""
    _reset_postgres(postgres_database)
    app = Oncely(postgres_database)

    @app.job(every(seconds=1))
    async def slow(db, now):  # type: ignore[no-untyped-def]
        await asyncio.sleep(1.6)  # still running when the next slot comes due: an overlap

    await app.migrate()
    engine = sa.create_engine(_sync_url(postgres_database))
    try:
        with engine.begin() as conn:
            for statement in REFUSE:
                conn.exec_driver_sql(statement.format(refusals=refusals))
        async with app.worker():
            if refusals == 2:
                # The first two tries of the first note were refused: it lands on the third,
                # and every overlap the worker reported has its note.
                await eventually(lambda: len(named(seen, "run.overlap_skipped", "slow")) >= 2)
                await eventually(
                    lambda: (
                        {f["key"] for f in named(seen, "run.overlap_skipped", "slow")}
                        <= overlap_notes(engine)
                    )
                )
            else:
                await eventually(lambda: bool(named(seen, "run.note_failed", "slow")))
        await app.aclose()
        skipped = {f["key"] for f in named(seen, "run.overlap_skipped", "slow")}
        failed = named(seen, "run.note_failed", "slow")
        if refusals == 2:
            assert failed == []
            assert skipped and skipped <= overlap_notes(engine)
        else:
            assert overlap_notes(engine) == set()
            first = failed[0]
            assert first["key"] in skipped
            assert (first["outcome"], first["tries"]) == ("overlap", 6)
            assert "note refused by the test" in first["error"]
    finally:
        engine.dispose()
