"""Bad input that slipped through: each is refused with one clear line and exit 2 (or a
specific OncelyError from the API), on SQLite and Postgres, and nothing is changed."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
from tests.support import cli_on, one_clear_line, snapshot

from oncely import BadInputError, Oncely, PayloadError, every

NUL = "\x00"
SURROGATE = "\ud800"


@pytest.fixture
def migrated(db_url: str) -> str:
    assert cli_on(db_url, "migrate").returncode == 0
    return db_url


def refused(db_url: str, *args: str) -> str:
    """Run a command that must be refused; its one error line (nothing changed)."""
    before = snapshot(db_url)
    done = cli_on(db_url, *args)
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    line = one_clear_line(done.stderr)
    assert snapshot(db_url) == before
    return line


@pytest.mark.parametrize(
    ("payload", "what"),
    [
        ('{"n": "a\\u0000b"}', "NUL"),
        ('{"n": {"a\\u0000": 1}}', "NUL"),
        ('{"n": ["\\ud800"]}', "lone surrogate"),
    ],
)
def test_enqueue_refuses_text_no_database_stores(migrated: str, payload: str, what: str) -> None:
    line = refused(migrated, "enqueue", "note", "--json", payload)
    assert what in line and "DETAIL" not in line, line


def test_a_date_that_does_not_exist_is_named_so(migrated: str) -> None:
    line = refused(migrated, "run", "minutely", "--now", "2026-02-30T18:00:00-06:00")
    assert "no such date or time" in line and "day is out of range" in line, line


def test_release_of_an_unknown_job_says_so(migrated: str) -> None:
    line = refused(migrated, "release", "nosuch", "k")
    assert "unknown job 'nosuch'" in line, line


@pytest.mark.parametrize(
    "args",
    [
        ["pause", "minutely"],
        ["release", "minutely", "k"],
        ["prune", "--older-than", "1d"],
        ["tasks", "retry", "1"],
    ],
)
def test_an_actor_over_255_characters_is_refused(migrated: str, args: list[str]) -> None:
    line = refused(migrated, *args, "--actor", "a" * 256)
    assert "at most 255 characters" in line, line


@pytest.fixture
async def app(migrated: str) -> Oncely:
    app = Oncely(migrated)

    @app.task
    async def note(db, s: str = "") -> None:  # type: ignore[no-untyped-def]
        return None

    @app.job(every(minutes=1))
    async def minutely(db, now):  # type: ignore[no-untyped-def]
        return None

    yield app  # type: ignore[misc]
    await app.aclose()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"s": NUL},
        {"s": SURROGATE},
        {"s": ["ok", {"k": f"v{NUL}"}]},
        {"s": {f"k{SURROGATE}": 1}},
    ],
)
async def test_the_api_refuses_unstorable_payloads(app: Oncely, kwargs: dict[str, object]) -> None:
    note = app.tasks.get("note")
    async with app.store.engine.begin() as conn:
        before = (await conn.exec_driver_sql("SELECT count(*) FROM oncely_tasks")).scalar()
    with pytest.raises(PayloadError, match=r"NUL|lone surrogate"):
        await note.enqueue(app.store.engine, **kwargs)
    with pytest.raises(PayloadError, match="NUL"):
        await note.enqueue(app.store.engine, idempotency_key=f"k{NUL}")
    async with app.store.engine.begin() as conn:
        after = (await conn.exec_driver_sql("SELECT count(*) FROM oncely_tasks")).scalar()
    assert after == before == 0


async def test_the_api_refuses_bad_numbers_and_ids(app: Oncely) -> None:
    with pytest.raises(BadInputError, match="timeout"):
        await app.task_result(1, timeout=math.nan)
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(BadInputError, match="max_slots"):
        await app.backfill_plan("minutely", start, start + timedelta(days=1), max_slots=math.nan)  # type: ignore[arg-type]
    year_one = datetime(1, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(BadInputError, match="the year must be"):
        await app.backfill_plan("minutely", year_one, start)
    with pytest.raises(BadInputError, match="years"):
        await app.prune(timedelta.max)
    for call in (app.retry_task, app.discard_task, app.cancel_task, app.task_record):
        with pytest.raises(BadInputError, match="task id is a positive integer"):
            await call("abc")  # type: ignore[arg-type]
    with pytest.raises(BadInputError, match="at most 255"):
        await app.pause("minutely", actor="a" * 256)
