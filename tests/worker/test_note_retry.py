"""The note of a slot a worker did not start (here an overlap) is written even when the database
refuses its first tries: the worker tries again, backing off; past its tries it says so
(`run.note_failed`) and `oncely verify` will call the slot unaccounted. The refusals are the
database's own: a trigger raises for the first N inserts of an overlap note."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from tests.conftest import _reset_postgres, _sync_url

from oncely import Oncely, events, every

Seen = list[tuple[str, dict[str, Any]]]

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


@pytest.fixture
def seen() -> Iterator[Seen]:
    got: Seen = []

    def observer(event: str, fields: Mapping[str, Any]) -> None:
        got.append((event, dict(fields)))

    events.subscribe(observer)
    yield got
    events.unsubscribe(observer)


async def eventually(predicate: Callable[[], bool], deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {deadline}s")


def named(seen: Seen, event: str) -> list[dict[str, Any]]:
    return [f for e, f in seen if e == event and f.get("job") == "slow"]


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
                await eventually(lambda: len(named(seen, "run.overlap_skipped")) >= 2)
                await eventually(
                    lambda: (
                        {f["key"] for f in named(seen, "run.overlap_skipped")}
                        <= overlap_notes(engine)
                    )
                )
            else:
                await eventually(lambda: bool(named(seen, "run.note_failed")))
        await app.aclose()
        skipped = {f["key"] for f in named(seen, "run.overlap_skipped")}
        failed = named(seen, "run.note_failed")
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
