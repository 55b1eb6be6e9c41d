"""`app.schedules`: a schedule is a row, every change is audited, bad input changes nothing,
and a slot run by hand is claimed once (its task enqueued in the claim's transaction)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy.dialects import postgresql
from tests.conftest import _reset_postgres
from tests.schedules.conftest import everything, fresh_app, rows

from oncely import Oncely, every
from oncely.errors import BadInputError, ConfigError, ScheduleError, UnknownScheduleError
from oncely.model import RunStatus
from oncely.schedules import describe, ledger_name
from oncely.store.schedules import LEDGER_PREFIX, last_claims
from oncely.testing.clock import FrozenClock

T0 = datetime(2026, 3, 2, 8, 30, tzinfo=timezone.utc)


def audit_rows(db_url: str) -> list[tuple[Any, ...]]:
    return rows(db_url, "SELECT action, job, actor FROM oncely_audit ORDER BY id")


async def test_add_makes_a_row_read_back_by_get_and_list(app: Oncely, db_url: str) -> None:
    with FrozenClock(T0):
        rec = await app.schedules.add(
            "acme-digest",
            cron="0 9 * * *",
            tz="Europe/Madrid",
            task="digest",
            args={"tenant": "acme"},
            by="ops",
        )
    assert rec.ledger_name == ledger_name("acme-digest") == "schedule:acme-digest"
    assert (rec.cron, rec.every, rec.tz, rec.state, rec.version) == (
        "0 9 * * *",
        None,
        "Europe/Madrid",
        "active",
        1,
    )
    assert (rec.target_kind, rec.target, rec.args, rec.changed_by) == (
        "task",
        "digest",
        {"tenant": "acme"},
        "ops",
    )
    # 09:00 in Madrid on 2 March 2026 is 08:00 UTC, already past at 08:30: the next is tomorrow.
    assert rec.next_slot == datetime(2026, 3, 3, 8, 0, tzinfo=timezone.utc)
    assert await app.schedules.get("acme-digest") == rec
    assert [r.name for r in await app.schedules.list()] == ["acme-digest"]
    assert describe(rec) == "every day at 09:00 (Europe/Madrid)"
    assert rec.expression == "0 9 * * *"
    assert audit_rows(db_url) == [("add", "schedule:acme-digest", "ops")]


async def test_every_takes_seconds_or_a_duration(app: Oncely) -> None:
    with FrozenClock(T0):
        a = await app.schedules.add("a", every="15m", task="digest", args={"tenant": "a"})
        b = await app.schedules.add("b", every=90, job="report")
    assert (a.every, a.expression, describe(a)) == (900.0, "every 15m", "every 15 minutes")
    assert (b.every, b.target_kind, b.next_slot) == (90.0, "job", T0 + timedelta(seconds=90))


BAD_ADDS: dict[str, dict[str, Any]] = {
    "bad cron": {"cron": "61 * * * *", "task": "digest", "args": {"tenant": "x"}},
    "cron of 4 fields": {"cron": "0 9 * *", "task": "digest", "args": {"tenant": "x"}},
    "unknown zone": {"cron": "0 9 * * *", "tz": "Mars/Olympus", "task": "digest"},
    "unknown task": {"every": "1h", "task": "no_such_task"},
    "unknown job": {"every": "1h", "job": "no_such_job"},
    "args that do not bind": {"every": "1h", "task": "digest", "args": {"tenant": "x", "n": 1}},
    "args missing": {"every": "1h", "task": "digest"},
    "args not JSON": {"every": "1h", "task": "digest", "args": {"tenant": {1, 2}}},
    "args not an object": {"every": "1h", "task": "digest", "args": ["x"]},
    "every 0s": {"every": "0s", "task": "digest", "args": {"tenant": "x"}},
    "every soon": {"every": "soon", "task": "digest", "args": {"tenant": "x"}},
    "every 1.5s": {"every": 1.5, "task": "digest", "args": {"tenant": "x"}},
    "cron and every": {"cron": "0 9 * * *", "every": "1h", "task": "digest"},
    "neither cron nor every": {"task": "digest", "args": {"tenant": "x"}},
    "task and job": {"every": "1h", "task": "digest", "job": "report"},
    "no target": {"every": "1h"},
    "bad catch_up": {"every": "1h", "job": "report", "catch_up": "some"},
    "bad overlap": {"every": "1h", "job": "report", "overlap": "maybe"},
    "negative grace": {"every": "1h", "job": "report", "grace": -1},
    "zero timeout": {"every": "1h", "job": "report", "timeout": 0},
    "interval in an unknown zone": {"every": "1h", "job": "report", "tz": "Nowhere/City"},
    "zone of 10,000 characters": {"cron": "0 9 * * *", "tz": "A" * 10_000, "job": "report"},
    "interval in a zone of 10,000 characters": {"every": "1h", "tz": "A" * 10_000, "job": "report"},
    "zone that is a file, not a zone": {"every": "1h", "tz": "posixrules", "job": "report"},
    "args over 64 KiB": {"every": "1h", "job": "report", "args": {"tenant": "x" * 65_536}},
}


@pytest.mark.parametrize("case", sorted(BAD_ADDS))
async def test_bad_add_is_refused_and_changes_nothing(app: Oncely, db_url: str, case: str) -> None:
    await app.schedules.add("keep", every="1h", job="report")
    before = everything(db_url)
    with pytest.raises(ScheduleError) as raised:
        await app.schedules.add("new-one", **BAD_ADDS[case])
    assert isinstance(raised.value, BadInputError)
    assert "\n" not in str(raised.value)
    assert everything(db_url) == before


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("keep", "exists already"),
        ("nightly", "job in the code"),
        ("bad name!", "not valid"),
        ("schedule:keep", "names schedule 'keep' in the ledger"),
        ("n" * 10_000, "not valid"),
    ],
)
async def test_a_taken_or_bad_name_is_refused(
    app: Oncely, db_url: str, name: str, words: str
) -> None:
    await app.schedules.add("keep", every="1h", job="report")
    before = everything(db_url)
    with pytest.raises(ScheduleError, match=words):
        await app.schedules.add(name, every="1h", job="report")
    assert everything(db_url) == before


async def test_update_decides_the_next_slot_from_the_change_on(app: Oncely, db_url: str) -> None:
    clock = FrozenClock(T0)
    with clock:
        rec = await app.schedules.add("t", cron="0 9 * * *", job="report", by="ops")
        clock.advance(hours=2)
        changed = await app.schedules.update("t", cron="30 10 * * *", tz="Asia/Tokyo", by="dev")
    assert changed.version == rec.version + 1
    assert (changed.cron, changed.tz, changed.changed_by) == ("30 10 * * *", "Asia/Tokyo", "dev")
    # 10:30 in Tokyo is 01:30 UTC: the first after 10:30 UTC on 2 March is 3 March's.
    assert changed.next_slot == datetime(2026, 3, 3, 1, 30, tzinfo=timezone.utc)
    with FrozenClock(T0 + timedelta(hours=3)):
        interval = await app.schedules.update("t", every="1h")
    assert (interval.cron, interval.every) == (None, 3600.0)
    args = await app.schedules.update("t", args={"tenant": "acme"})
    assert args.next_slot == interval.next_slot  # not a change of when: the next slot stays
    assert [a for a, _, _ in audit_rows(db_url)] == ["add", "update", "update", "update"]
    before = everything(db_url)
    with pytest.raises(ScheduleError):
        await app.schedules.update("t", cron="not cron")
    with pytest.raises(UnknownScheduleError):
        await app.schedules.update("absent", cron="0 9 * * *")
    assert everything(db_url) == before


async def test_a_stale_version_is_refused_whatever_its_values_even_if_changed_after_the_read(
    app: Oncely, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await app.schedules.add("v", every="1h", job="report")
    read = app.schedules.get
    other = {"1h": "2h", "2h": "1h"}

    async def read_then_changed_elsewhere(name: str) -> Any:
        found = await read(name)
        assert found.every is not None
        changed = other[f"{found.every / 3600:.0f}h"]
        app.schedules.update_sync(name, every=changed, by="other")  # commits after the read
        return found

    for repeated in (True, False):  # the values it was read with, or none
        loaded = await read("v")
        repeat = {"every": f"{(loaded.every or 0) / 3600:.0f}h"} if repeated else {}
        monkeypatch.setattr(app.schedules, "get", read_then_changed_elsewhere)
        with pytest.raises(ScheduleError, match="changed meanwhile: nothing changed"):
            await app.schedules.update("v", version=loaded.version, **repeat)
        monkeypatch.undo()
        after = await read("v")
        assert (after.version, after.changed_by) == (loaded.version + 1, "other")
        assert [a for a, _, _ in audit_rows(db_url)].count("update") == 1 + (not repeated)
    current = await app.schedules.get("v")
    same = await app.schedules.update("v", every=current.every, version=current.version)
    assert same.version == current.version  # a current version that changes nothing: ok
    with pytest.raises(ScheduleError, match="version must be an int"):
        await app.schedules.update("v", every="2h", version=True)  # type: ignore[arg-type]


async def test_a_schedule_and_a_code_job_never_share_a_ledger_name(
    app: Oncely, db_url: str
) -> None:
    with FrozenClock(T0):
        await app.schedules.add("foo", every="1h", job="report")
    with pytest.raises(ConfigError, match="starts with 'schedule:'"):
        app.job(every(hours=1), name="schedule:foo")(lambda db, now: None)
    with pytest.raises(ScheduleError, match="starts with 'schedule:'"):
        await app.schedules.add("schedule:foo", every="1h", job="report")
    # A code job `foo` deployed beside schedule `foo`: each releases its own claim.
    app.job(every(hours=1), name="foo")(lambda db, now: None)
    with FrozenClock(T0 + timedelta(hours=1)):
        await app.schedules.run_due("foo")
        await app.run("foo")
    key = "2026-03-02T09:00:00Z"
    claims = "SELECT job, key FROM oncely_runs ORDER BY job"
    assert rows(db_url, claims) == [("foo", key), ("schedule:foo", key)]
    await app.release("schedule:foo", key)
    assert rows(db_url, claims) == [("foo", key)]
    await app.release("foo", key)
    assert rows(db_url, claims) == []


async def test_pause_and_resume_are_audited_and_keep_the_pause_rows(
    app: Oncely, db_url: str
) -> None:
    await app.schedules.add("p", every="1h", job="report")
    paused = await app.schedules.pause("p", reason="customer left", by="ops")
    assert (paused.state, paused.pause_reason) == ("paused", "customer left")
    assert (await app.pauses())["schedule:p"].reason == "customer left"
    with pytest.raises(ScheduleError, match="paused already"):
        await app.schedules.pause("p")
    resumed = await app.schedules.resume("p", by="ops")
    assert (resumed.state, resumed.pause_reason) == ("active", None)
    assert "schedule:p" not in await app.pauses()
    with pytest.raises(ScheduleError, match="not paused"):
        await app.schedules.resume("p")
    assert audit_rows(db_url) == [
        ("add", "schedule:p", audit_rows(db_url)[0][2]),
        ("pause", "schedule:p", "ops"),
        ("resume", "schedule:p", "ops"),
    ]


async def test_remove_leaves_the_list_and_unknown_names_are_refused(
    app: Oncely, db_url: str
) -> None:
    await app.schedules.add("r", every="1h", job="report")
    await app.schedules.remove("r", by="ops")
    assert await app.schedules.list() == []
    assert audit_rows(db_url)[-1] == ("remove", "schedule:r", "ops")
    before = everything(db_url)
    for call in (
        app.schedules.remove("r"),
        app.schedules.pause("r"),
        app.schedules.resume("r"),
        app.schedules.get("r"),
        app.schedules.run_due("r"),
    ):
        with pytest.raises(UnknownScheduleError, match="no schedule named 'r'"):
            await call
    assert everything(db_url) == before


async def test_run_due_claims_the_slot_once_and_enqueues_the_task_with_it(
    app: Oncely, db_url: str
) -> None:
    clock = FrozenClock(T0)
    with clock:
        await app.schedules.add("acme", cron="0 * * * *", task="digest", args={"tenant": "acme"})
        with pytest.raises(ScheduleError, match="no slot"):
            await app.schedules.run_due("acme")  # 08:00 came before it was added
        clock.advance(hours=1)
        first = await app.schedules.run_due("acme", by="ops")
        second = await app.schedules.run_due("acme", by="ops")
    assert (first.status, second.status) == (RunStatus.RAN, RunStatus.SKIPPED)
    assert first.job == "schedule:acme" and first.key == "2026-03-02T09:00:00Z"
    claims = rows(db_url, "SELECT job, key FROM oncely_runs")
    assert claims == [("schedule:acme", "2026-03-02T09:00:00Z")]
    tasks = rows(db_url, "SELECT task, idempotency_key FROM oncely_tasks")
    assert tasks == [("digest", "schedule:acme:2026-03-02T09:00:00Z")]
    assert (await app.schedules.get("acme")).next_slot == datetime(
        2026, 3, 2, 10, tzinfo=timezone.utc
    )
    last = await app.schedules.last_runs()
    assert last["acme"].key == "2026-03-02T09:00:00Z"
    assert [a for a, _, _ in audit_rows(db_url)] == ["add", "run_slot", "run_slot"]


async def test_run_due_of_a_job_target_calls_it_with_the_stored_arguments(
    app: Oncely, db_url: str
) -> None:
    clock = FrozenClock(T0)
    with clock:
        await app.schedules.add("acme-report", every="30m", job="report", args={"tenant": "acme"})
        clock.advance(minutes=31)
        result = await app.schedules.run_due("acme-report")
    assert result.status is RunStatus.RAN
    assert rows(db_url, "SELECT what, arg FROM effects") == [
        ("report", "acme 2026-03-02T09:00:00+00:00")
    ]


def test_the_sync_twins_work_from_plain_code(db_url: str) -> None:
    from tests.schedules.conftest import fresh_app, migrate

    migrate(db_url)
    app = fresh_app(db_url)
    rec = app.schedules.add_sync("s", every="1h", task="digest", args={"tenant": "s"}, by="me")
    assert app.schedules.get_sync("s") == rec
    assert app.schedules.pause_sync("s").state == "paused"
    assert app.schedules.resume_sync("s").state == "active"
    assert app.schedules.update_sync("s", every="2h").every == 7200.0
    assert [r.name for r in app.schedules.list_sync()] == ["s"]
    with pytest.raises(UnknownScheduleError):
        app.schedules.remove_sync("nope")
    app.schedules.remove_sync("s")
    assert app.schedules.list_sync() == []


async def test_update_with_a_stale_version_is_refused(app: Oncely, db_url: str) -> None:
    rec = await app.schedules.add("v", every="1h", job="report", grace=30)
    await app.schedules.update("v", every="2h", version=rec.version)
    before = everything(db_url)
    with pytest.raises(ScheduleError, match="changed since"):
        await app.schedules.update("v", every="3h", version=rec.version)
    assert everything(db_url) == before
    cleared = await app.schedules.update("v", grace=None)
    assert (cleared.grace, cleared.every) == (None, 7200.0)


async def test_list_pages_by_name_and_job_gives_the_runners_job(app: Oncely) -> None:
    for name in ("c", "a", "b"):
        await app.schedules.add(name, every="1h", job="report")
    assert [r.name for r in await app.schedules.list(limit=2)] == ["a", "b"]
    assert [r.name for r in await app.schedules.list(after="b")] == ["c"]
    job = await app.schedules.job("a")
    assert (job.name, job.catch_up, job.key_for(T0)) == (
        "schedule:a",
        "latest",
        "2026-03-02T08:30:00Z",
    )


async def test_last_runs_gives_each_schedule_s_newest_claim_and_counts_them(
    app: Oncely, db_url: str
) -> None:
    clock = FrozenClock(T0)
    with clock:
        assert await app.schedules.counts() == (0, 0)
        for name in ("acme", "beta", "gone"):
            await app.schedules.add(name, cron="0 * * * *", task="digest", args={"tenant": name})
        await app.schedules.add("idle", every="1h", task="digest", args={"tenant": "idle"})
        for _hour in range(3):
            clock.advance(hours=1)
            for name in ("acme", "gone"):
                await app.schedules.run_due(name)
        await app.schedules.run_due("beta")  # its newest (and only) slot: the last hour
        await app.schedules.pause("beta")
        await app.schedules.remove("gone")
    last = await app.schedules.last_runs()
    assert {name: claim.key for name, claim in last.items()} == {
        "acme": "2026-03-02T11:00:00Z",
        "beta": "2026-03-02T11:00:00Z",
    }  # `gone` was removed (its claims stay in the ledger), `idle` never ran
    assert len(rows(db_url, "SELECT * FROM oncely_runs WHERE job = 'schedule:gone'")) == 3
    assert await app.schedules.counts() == (3, 1)
    assert app.schedules.counts_sync() == (3, 1)


@pytest.mark.postgres
async def test_last_runs_reads_each_schedule_s_newest_claim_by_index_not_the_ledger(
    postgres_database: str,
) -> None:
    """However long the ledger, `last_runs` costs one index lookup per schedule: the plan
    of its statement on a ledger of 20,000 claims (2,000 names) reads oncely_runs by its index on
    (job, claimed_at), never the whole table."""
    db_url = postgres_database
    _reset_postgres(db_url)
    app = fresh_app(db_url)
    await app.migrate()
    for name in ("acme", "beta"):
        await app.schedules.add(name, every="1s", task="digest", args={"tenant": name})
    async with app.store.transaction() as conn:
        await conn.exec_driver_sql(
            "INSERT INTO oncely_runs (job, key, scheduled_for, claimed_at, claimed_by) "
            "SELECT 'schedule:' || (CASE WHEN i % 100 = 0 THEN 'acme' WHEN i % 100 = 1 "
            "THEN 'beta' ELSE 'old' || i % 2000 END), 'k' || i, "
            "now() - i * interval '1 second', now() - i * interval '1 second', 'r' "
            "FROM generate_series(1, 20000) AS i"
        )
        await conn.exec_driver_sql("ANALYZE oncely_runs")
        await conn.exec_driver_sql("ANALYZE oncely_schedules")
    statement = last_claims(LEDGER_PREFIX).compile(
        dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}
    )
    plan = "\n".join(r[0] for r in rows(db_url, f"EXPLAIN {statement}"))
    assert "Seq Scan on oncely_runs" not in plan, plan
    assert "oncely_runs_job_claimed_at" in plan, plan
    last = await app.schedules.last_runs()
    assert sorted(last) == ["acme", "beta"]
    newest = rows(
        db_url,
        "SELECT max(key) FROM oncely_runs WHERE claimed_at = "
        "(SELECT max(claimed_at) FROM oncely_runs WHERE job = 'schedule:acme')",
    )
    assert last["acme"].key == newest[0][0]
    await app.aclose()
