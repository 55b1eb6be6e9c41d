"""run_replicas (the incident: N real processes, one slot) and the frozen clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from tests.apps import leaderboard

from oncely import Oncely, clock
from oncely.errors import BadInputError
from oncely.testing import FrozenClock, run_replicas, using_database

FRIDAY_1800 = datetime.fromisoformat("2026-11-27T18:00:00-06:00")


@pytest.fixture
async def board(
    db_url: str, sync_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Oncely]:
    monkeypatch.setenv("ONCELY_DATABASE_URL", db_url)
    async with using_database(leaderboard.app, db_url) as app:
        await app.migrate()
        leaderboard.create_tables(sync_engine)
        yield app


def payouts(engine: sa.Engine) -> int:
    """Weekly payouts made: each pays the top 3 members."""
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM coins")).scalar_one()) // 3


@pytest.mark.parametrize("concurrently", [False, True], ids=["staggered", "together"])
async def test_run_replicas_three_processes_one_slot(
    board: Oncely, sync_engine: sa.Engine, concurrently: bool
) -> None:
    result = await run_replicas(
        board,
        "leaderboard_close",
        n=3,
        stagger=timedelta(minutes=1),
        at=FRIDAY_1800,
        concurrently=concurrently,
        effects=lambda: payouts(sync_engine),
    )
    result.assert_once()
    assert len(result) == 3 and len({d.pid for d in result}) == 3
    if not concurrently:
        assert result.statuses == ["ran", "skipped", "skipped"]
    assert {d.key for d in result} == {"2026-11-28T00:00:00Z"}


async def test_run_replicas_defaults_to_the_slot_due_at_the_frozen_clock(
    board: Oncely, sync_engine: sa.Engine
) -> None:
    with FrozenClock(FRIDAY_1800 + timedelta(minutes=7)):
        result = await run_replicas(board, "leaderboard_close", n=2)
    result.assert_once()
    assert {d.key for d in result} == {"2026-11-28T00:00:00Z"}


async def test_replicas_that_fire_for_different_slots_fail_assert_once(
    board: Oncely, sync_engine: sa.Engine
) -> None:
    """A stagger of a week puts the replicas in different slots: that is not a duplicate."""
    result = await run_replicas(
        board, "leaderboard_close", n=2, stagger=timedelta(days=7), at=FRIDAY_1800
    )
    assert result.statuses == ["ran", "ran"]
    with pytest.raises(AssertionError, match="different keys"):
        result.assert_once()


def test_frozen_clock_freezes_and_moves_what_oncely_reads() -> None:
    start = datetime(2026, 11, 27, 23, 59, tzinfo=timezone.utc)
    with FrozenClock(start) as frozen:
        assert clock.utcnow() == start
        assert clock.utcnow() == start  # frozen: no time passes by itself
        frozen.advance(minutes=1, seconds=30)
        assert clock.utcnow() == start + timedelta(seconds=90)
        frozen.set("2026-01-01T00:00:00+00:00")
        assert clock.utcnow().year == 2026 and clock.utcnow().month == 1
        with pytest.raises(BadInputError, match="forward"):
            frozen.advance(-1)
    assert abs(clock.utcnow() - datetime.now(timezone.utc)) < timedelta(seconds=5)


def test_frozen_clock_picks_the_slot() -> None:
    with FrozenClock(FRIDAY_1800 - timedelta(seconds=1)) as frozen:
        before = leaderboard.app.slot("leaderboard_close")
        frozen.advance(seconds=1)
        at = leaderboard.app.slot("leaderboard_close")
    assert before.at == FRIDAY_1800 - timedelta(days=7)
    assert at.at == FRIDAY_1800


def test_frozen_clock_needs_an_aware_time() -> None:
    with pytest.raises(BadInputError, match="aware"):
        FrozenClock(datetime(2026, 1, 1))


def test_frozen_clock_fixture(frozen_clock: FrozenClock) -> None:
    assert clock.utcnow() == frozen_clock.now()
    frozen_clock.advance(hours=1)
    assert clock.utcnow() == frozen_clock.now()
