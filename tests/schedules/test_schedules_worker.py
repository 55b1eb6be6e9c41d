"""The worker runs the schedules kept as data: a schedule added while it runs fires, each
slot claimed once with its task enqueued in the claim's transaction; a pause stops its
slots, a removal ends them; a slot that fails moves the schedule on."""

from __future__ import annotations

from tests.schedules.conftest import rows, until

from oncely import Oncely


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
