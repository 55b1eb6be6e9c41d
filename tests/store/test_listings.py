"""The ledger's per-job reads and the task listings, on SQLite and Postgres: what they return
(their cost is bench/listing_plans.py's)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from oncely.model import TaskState
from oncely.store import Store

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
CLAIM = sa.text(
    "INSERT INTO oncely_runs (job, key, scheduled_for, claimed_at, claimed_by)"
    " VALUES (:job, :key, :slot, :at, 'test')"
)


def _claim(job: str, key: str, slot: datetime | None, at: datetime) -> dict[str, object]:
    return {"job": job, "key": key, "slot": slot, "at": at}


async def test_each_jobs_newest_slot_and_last_claim(store: Store) -> None:
    rows = [
        # a: hourly slots; then slot 0 backfilled last (newest claim, not the newest slot)
        *(_claim("a", f"a{h}", T0 + timedelta(hours=h), T0 + timedelta(hours=h)) for h in (1, 2)),
        _claim("a", "a0", T0, T0 + timedelta(days=1)),
        _claim("b", "b5", T0 + timedelta(hours=5), T0 + timedelta(hours=5)),
        _claim("c", "keyed", None, T0 + timedelta(hours=3)),  # an effect's key: no slot
        *(_claim(f"j{n:03}", "k", T0, T0 + timedelta(minutes=n)) for n in range(30)),
    ]
    async with store.engine.begin() as conn:
        await conn.execute(CLAIM.bindparams(sa.bindparam("slot", type_=sa.DateTime(True))), rows)
        if store.engine.dialect.name == "sqlite":  # the ledger's text form on SQLite
            await conn.exec_driver_sql(
                "UPDATE oncely_runs SET scheduled_for = substr(scheduled_for, 1, 19),"
                " claimed_at = substr(claimed_at, 1, 19)"
            )
    slots = await store.claims.last_slots()
    assert slots["a"] == T0 + timedelta(hours=2) and slots["b"] == T0 + timedelta(hours=5)
    assert "c" not in slots  # no slot, no catch-up floor
    assert len(slots) == 32 and slots["j029"] == T0
    last = await store.claims.last_claims()
    assert set(last) == {"a", "b", "c", *(f"j{n:03}" for n in range(30))}
    assert (last["a"].key, last["b"].key, last["c"].key) == ("a0", "b5", "keyed")
    assert last["j017"].claimed_at == T0 + timedelta(minutes=17)


async def test_succeeded_tasks_are_listed_most_recently_finished_first(store: Store) -> None:
    async with store.engine.begin() as conn:
        for n, (state, ended) in enumerate(
            [("succeeded", 3), ("succeeded", 1), ("available", None), ("succeeded", 2)]
        ):
            at = T0 + timedelta(minutes=n)
            await conn.execute(
                sa.text(
                    "INSERT INTO oncely_tasks (task, queue, args, state, attempt, run_at,"
                    " created_at, finished_at) VALUES (:task, 'default', '{}', :state, 1, :at,"
                    " :at, :ended)"
                ).bindparams(
                    sa.bindparam("at", type_=sa.DateTime(True)),
                    sa.bindparam("ended", type_=sa.DateTime(True)),
                ),
                {
                    "task": f"t{n}",
                    "state": state,
                    "at": at,
                    "ended": None if ended is None else T0 + timedelta(hours=ended),
                },
            )
    listed = await store.tasks.listing(TaskState.SUCCEEDED, None, 50)
    assert [r.task for r in listed] == ["t0", "t3", "t1"]
    every = await store.tasks.listing(None, None, 2)
    assert [r.task for r in every] == ["t3", "t2"]  # newest ids first
