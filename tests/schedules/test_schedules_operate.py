"""A schedule's slots have a code job's operations: `history` and `explain` by its bare name
or its ledger name, `verify` (all jobs include the schedules), `backfill` of the slots its
pause held, each once, and `explain` answers `paused` while it is paused."""

from __future__ import annotations

from datetime import timedelta

from tests.schedules.conftest import rows, until

from oncely import Oncely
from oncely.model import RunStatus


def keys(db_url: str, job: str) -> list[str]:
    found = rows(db_url, "SELECT key FROM oncely_runs WHERE job = :j ORDER BY key", j=job)
    return [k for (k,) in found]


async def test_history_explain_verify_and_backfill_answer_for_a_schedule(
    app: Oncely, db_url: str
) -> None:
    async with app.worker(schedule_poll=0.2, concurrency=0):
        await app.schedules.add("acme", every="1s", job="report", args={"tenant": "acme"})
        await until(lambda: len(keys(db_url, "schedule:acme")) >= 2, "two slots")
        paused = await app.schedules.pause("acme", reason="quiet")
        deadline = await app.store.database_time() + timedelta(seconds=2.5)

        async def past() -> bool:
            return await app.store.database_time() >= deadline

        await until(past, "two slots inside the pause")
        explained = await app.explain("acme")
        assert explained.answer == "paused", explained.sentence
        assert "quiet" in explained.sentence
        await app.schedules.resume("acme")
    ran = keys(db_url, "schedule:acme")
    history = await app.history("acme")
    assert sorted(c.key for c in history) == ran
    assert {c.job for c in await app.history("schedule:acme")} == {"schedule:acme"}
    start = paused.changed_at
    plan = await app.backfill_plan("acme", start, start + timedelta(seconds=2))
    assert [p.action for p in plan] == ["would run", "would run"], plan
    results = await app.backfill("acme", start, start + timedelta(seconds=2))
    assert [r.status for r in results] == [RunStatus.RAN, RunStatus.RAN]
    again = await app.backfill("acme", start, start + timedelta(seconds=2))
    assert again == []  # both claimed: nothing to run
    effects = rows(db_url, "SELECT arg FROM effects")
    assert len(effects) == len(keys(db_url, "schedule:acme")) == len({a for (a,) in effects})
    verdict = await app.verify(since=history[-1].scheduled_for)
    names = [v.job for v in verdict.jobs]
    assert "schedule:acme" in names
    acme = next(v for v in verdict.jobs if v.job == "schedule:acme")
    assert acme.findings == (), acme.summary()
