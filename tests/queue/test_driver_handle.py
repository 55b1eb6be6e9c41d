"""`oncely.asyncpg_connection(db)`: a task, job or effect that asks for the driver's connection
under its session sends its statements in the session's own transaction. A task's work on it
commits with its ack (alone, or inside its savepoint in a group) or not at all; a job's, with
its claim; elsewhere than Postgres on asyncpg it is refused by name."""

from __future__ import annotations

import asyncio
import collections
from datetime import datetime, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from queue_helpers import all_ended, drain, effects, in_tx  # type: ignore[import-not-found]
from sqlalchemy.ext.asyncio import AsyncSession

from oncely import (
    ConfigError,
    JobTransactionError,
    Oncely,
    RetryPolicy,
    RunStatus,
    asyncpg_connection,
    every,
)

INSERT = "INSERT INTO effects (n) VALUES ($1)"
SLOT = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Boom(Exception):
    """A task's own failure."""


async def rows(app: Oncely) -> dict[int, Any]:
    """Each task's state and attempt, and the transaction ids of its row and of its effects,
    by its `n`."""
    async with app.store.engine.connect() as conn:
        found = await conn.execute(
            sa.text(
                "SELECT t.state, t.attempt, CAST(CAST(t.args AS jsonb) ->> 'n' AS int) AS n,"
                " t.xmin::text AS acked_in,"
                " ARRAY(SELECT DISTINCT e.xmin::text FROM effects e"
                "   WHERE e.n = CAST(CAST(t.args AS jsonb) ->> 'n' AS int)) AS effects_in"
                " FROM oncely_tasks t"
            )
        )
        return {r.n: r for r in found}


@pytest.mark.postgres
@pytest.mark.parametrize("group", [1, 10])
async def test_a_task_writing_on_the_driver_commits_with_its_ack_and_a_failure_rolls_it_back(
    pg_app: Oncely, group: int
) -> None:
    calls: collections.Counter[int] = collections.Counter()

    @pg_app.task(retry=RetryPolicy(attempts=3, wait=0.05, backoff="fixed", jitter=0))
    async def write(db: Any, n: int) -> None:
        calls[n] += 1
        conn = await asyncpg_connection(db)
        await conn.execute(INSERT, n)
        await db.execute(sa.text("INSERT INTO effects (n) VALUES (:n)"), {"n": n})  # the session
        if n % 7 == 3 and calls[n] == 1:
            raise Boom("fails once, after both inserts")

    await in_tx(pg_app, lambda db: write.enqueue_many(db, [{"n": n} for n in range(40)]))
    await drain(pg_app, lambda: all_ended(pg_app), concurrency=2, group=group)

    failing = {n for n in range(40) if n % 7 == 3}
    assert calls == {n: 2 if n in failing else 1 for n in range(40)}
    # Each task's two inserts once: the failed attempt's rolled back with it.
    assert await effects(pg_app) == sorted([*range(40), *range(40)])
    found = await rows(pg_app)
    assert {n: (r.state, r.attempt) for n, r in found.items()} == {
        n: ("succeeded", 2 if n in failing else 1) for n in range(40)
    }
    # The driver's insert, the session's and the ack: one (sub)transaction.
    assert all(r.effects_in == [r.acked_in] for r in found.values())


@pytest.mark.postgres
async def test_a_grouped_task_on_the_driver_alone_never_begins_its_session(pg_app: Oncely) -> None:
    in_session: list[bool] = []
    kept: list[Any] = []

    @pg_app.task
    async def write(db: Any, n: int) -> None:
        conn = await asyncpg_connection(db)
        await conn.execute(INSERT, n)
        in_session.append(db.in_transaction())  # the group's savepoint holds it, not the session
        kept.append(db)

    await in_tx(pg_app, lambda db: write.enqueue_many(db, [{"n": n} for n in range(30)]))
    await drain(pg_app, lambda: all_ended(pg_app), concurrency=2, group=5)

    assert await effects(pg_app) == list(range(30))
    found = await rows(pg_app)
    assert all(r.state == "succeeded" and r.effects_in == [r.acked_in] for r in found.values())
    # Most ran in groups; the last ones, with no backlog left, may run alone, where the task's
    # own transaction begins with its session.
    assert in_session.count(False) >= 10, in_session
    # A session kept past its task lends nothing: the group's connection has moved on.
    with pytest.raises(JobTransactionError, match="belonged to an attempt that has ended"):
        await asyncpg_connection(kept[0])


@pytest.mark.postgres
@pytest.mark.parametrize("group", [1, 5])
async def test_a_task_asking_twice_at_once_gets_one_connection_in_its_transaction(
    pg_app: Oncely, group: int
) -> None:
    @pg_app.task
    async def write(db: Any, n: int) -> None:
        first, second = await asyncio.gather(asyncpg_connection(db), asyncpg_connection(db))
        assert first is second
        await first.execute(INSERT, n)

    await in_tx(pg_app, lambda db: write.enqueue_many(db, [{"n": n} for n in range(20)]))
    await drain(pg_app, lambda: all_ended(pg_app), concurrency=2, group=group)

    assert await effects(pg_app) == list(range(20))
    found = await rows(pg_app)
    assert all(r.state == "succeeded" and r.effects_in == [r.acked_in] for r in found.values())


@pytest.mark.postgres
async def test_a_job_writing_on_the_driver_commits_with_its_claim(pg_app: Oncely) -> None:
    @pg_app.job(every(seconds=1), name="drives")
    async def drives(db, now) -> None:  # type: ignore[no-untyped-def]
        await (await asyncpg_connection(db)).execute(INSERT, 1)

    @pg_app.job(every(seconds=1), name="fails")
    async def fails(db, now) -> None:  # type: ignore[no-untyped-def]
        await (await asyncpg_connection(db)).execute(INSERT, 2)
        raise Boom("after writing on the driver")

    assert (await pg_app.run("drives", now=SLOT)).status is RunStatus.RAN
    assert (await pg_app.run("drives", now=SLOT)).status is RunStatus.SKIPPED
    assert (await pg_app.attempt("fails", now=SLOT)).status is RunStatus.FAILED
    assert await effects(pg_app) == [1]
    async with pg_app.store.engine.connect() as conn:
        claim_in, effect_in = (
            await conn.execute(
                sa.text(
                    "SELECT (SELECT xmin::text FROM oncely_runs WHERE job = 'drives'),"
                    " (SELECT xmin::text FROM effects)"
                )
            )
        ).one()
    assert claim_in == effect_in


async def test_it_is_refused_by_name_where_there_is_no_asyncpg_transaction(
    app: Oncely, db_url: str
) -> None:
    async with AsyncSession(app.store.engine) as db, db.begin():
        if db_url.startswith("sqlite"):
            with pytest.raises(ConfigError, match=r"postgresql\+asyncpg; this one runs on sqlite"):
                await asyncpg_connection(db)
        else:
            conn = await asyncpg_connection(db)
            assert conn.is_in_transaction()
    with pytest.raises(ConfigError, match=r"takes an AsyncSession \(an async task's.*, not str"):
        await asyncpg_connection("db")  # type: ignore[arg-type]
    assert await effects(app) == []
