"""The app the fleet runs, in two versions ($ONCELY_FLEET_VERSION, default 1): version 2 is
the "deploy": task `work` takes one more argument (`tag`) and a new task `work_v2` exists.

Every job and task writes its effect row in its own transaction, with no unique key, so that
a double effect is countable: `fleet_job_effects (job, slot)` per slot run,
`fleet_task_effects (task, key)` per task run (key: the task's idempotency key).

- `tick_all`: every second, catch_up="all" (grace 5 min);
- `tick_latest`: every second, catch_up="latest";
- `flaky`: every 2 s; raises at the first attempt of every third slot (a transient error: the
  default retry policy runs the slot again, on whichever replica, and it runs once);
- `timeouty`: every 3 s, 0.4 s timeout; sleeps past it at the first attempt of every third
  slot (retried the same way);
- `slow`: every 4 s, takes 2.5 s (the operator cancels it now and then);
- tasks `work(n)` and `limited(n)` (concurrency 1 in the database), `work_v2(n)` (v2);
- task `scheduled(name)`: what the fleet's schedules kept as data enqueue at each slot;
- task `grouped_work(n)`, on a queue of its own (`grouped`) that only the workers with
  `--group` serve: the backlog they run in groups.
"""

from __future__ import annotations

import asyncio
import os
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from oncely import Oncely, asyncpg_connection, every
from oncely.identity import replica_id

VERSION = int(os.environ.get("ONCELY_FLEET_VERSION", "1"))
GROUPED_QUEUE = "grouped"

app = Oncely()

TABLES = (
    "CREATE TABLE IF NOT EXISTS fleet_job_effects (job varchar(64) NOT NULL, "
    "slot varchar(64) NOT NULL, replica varchar(255) NOT NULL)",
    "CREATE TABLE IF NOT EXISTS fleet_task_effects (task varchar(64) NOT NULL, "
    "key varchar(255) NOT NULL, replica varchar(255) NOT NULL, tag varchar(64))",
)
_JOB = sa.text("INSERT INTO fleet_job_effects (job, slot, replica) VALUES (:j, :s, :r)")
_TASK = sa.text("INSERT INTO fleet_task_effects (task, key, replica, tag) VALUES (:t, :k, :r, :g)")


async def _effect(db, name: str, slot: datetime) -> None:  # type: ignore[no-untyped-def]
    await db.execute(_JOB, {"j": name, "s": slot.isoformat(), "r": replica_id()})


def _third(slot: datetime, period: int) -> bool:
    return int(slot.timestamp()) // period % 3 == 0


_ENDED = sa.text(
    "SELECT count(*) FROM oncely_attempts WHERE job = :j AND key = :k AND outcome IS NOT NULL"
)


async def _first_attempt(db, name: str, slot: datetime) -> bool:  # type: ignore[no-untyped-def]
    """No attempt of this slot has ended before (this one's start row holds no outcome yet)."""
    key = slot.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return int((await db.execute(_ENDED, {"j": name, "k": key})).scalar_one()) == 0


@app.job(every(seconds=1), catch_up="all", grace=timedelta(minutes=5))
async def tick_all(db, now):  # type: ignore[no-untyped-def]
    await _effect(db, "tick_all", now)


@app.job(every(seconds=1), catch_up="latest")
async def tick_latest(db, now):  # type: ignore[no-untyped-def]
    await _effect(db, "tick_latest", now)


@app.job(every(seconds=2))
async def flaky(db, now):  # type: ignore[no-untyped-def]
    await _effect(db, "flaky", now)
    if _third(now, 2) and await _first_attempt(db, "flaky", now):
        raise RuntimeError("flaky: the upstream answered 503")


@app.job(every(seconds=3), timeout=timedelta(seconds=0.4))
async def timeouty(db, now):  # type: ignore[no-untyped-def]
    await _effect(db, "timeouty", now)
    if _third(now, 3) and await _first_attempt(db, "timeouty", now):
        await asyncio.sleep(1.0)


@app.job(every(seconds=4))
async def slow(db, now):  # type: ignore[no-untyped-def]
    await _effect(db, "slow", now)
    await asyncio.sleep(2.5)


async def _task_effect(db, task: str, key: str, tag: str | None) -> None:  # type: ignore[no-untyped-def]
    await db.execute(_TASK, {"t": task, "k": key, "r": replica_id(), "g": tag})


if VERSION >= 2:

    @app.task
    async def work(db, n: int, tag: str = "v1"):  # type: ignore[no-untyped-def]
        await _task_effect(db, "work", f"work:{n}", tag)

    @app.task
    async def work_v2(db, n: int):  # type: ignore[no-untyped-def]
        await _task_effect(db, "work_v2", f"work_v2:{n}", "v2")

else:

    @app.task  # type: ignore[no-redef]
    async def work(db, n: int):  # type: ignore[no-untyped-def]
        await _task_effect(db, "work", f"work:{n}", None)


@app.task
async def scheduled(db, name: str):  # type: ignore[no-untyped-def]
    """The target of the fleet's data schedules: one effect row per slot run (key: the
    schedule's name; the checks count them against the schedule's claimed slots)."""
    await _task_effect(db, "scheduled", name, None)


@app.task(queue=GROUPED_QUEUE)
async def grouped_work(db, n: int):  # type: ignore[no-untyped-def]
    """Half of them (odd `n`, on Postgres) write their effect on the driver's connection the
    task's session lends (`asyncpg_connection`: its transaction or savepoint begun on the
    driver), the others through the session."""
    if n % 2 and db.bind.dialect.name == "postgresql":
        conn = await asyncpg_connection(db)
        await conn.execute(
            "INSERT INTO fleet_task_effects (task, key, replica) VALUES ($1, $2, $3)",
            "grouped_work",
            f"grouped_work:{n}",
            replica_id(),
        )
        return
    await _task_effect(db, "grouped_work", f"grouped_work:{n}", None)


@app.task(concurrency=1)
async def limited(db, n: int):  # type: ignore[no-untyped-def]
    await asyncio.sleep(0.2)
    await _task_effect(db, "limited", f"limited:{n}", None)
