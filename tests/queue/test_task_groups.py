"""Groups of tasks (`group=N`, Postgres): with a backlog, up to N async tasks run one after
another in one transaction, a savepoint each, one COMMIT for all. Each task's work lands with
its ack or not at all; a task that raises or lost its lease rolls back alone; a COMMIT that
fails lands nothing of the group and every task of it runs again, once; a worker SIGKILLed
mid-group commits nothing of it, and its tasks run again, each effect once."""

from __future__ import annotations

import asyncio
import collections
import signal
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from queue_helpers import all_ended, drain, effects, in_tx  # type: ignore[import-not-found]
from sqlalchemy.orm import Session
from tests.apps.queue_app import EFFECTS_DDL, hang, record
from tests.conftest import _reset_postgres, _sync_url
from tests.support import ROOT, run_cli, start_cli, stop, wait_until

from oncely import Oncely, RetryPolicy, TaskState
from oncely.errors import BadInputError
from oncely.work.options import WorkerOptions

pytestmark = pytest.mark.postgres

INSERT = sa.text("INSERT INTO effects (n) VALUES (:n)")


class Boom(Exception):
    """A task's own failure."""


class Messages:
    """Counts the group messages this process sends (asyncpg's simple queries)."""

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()


@pytest.fixture
def messages(monkeypatch: pytest.MonkeyPatch) -> Messages:
    seen = Messages()
    execute = asyncpg.Connection.execute

    async def counting(self: asyncpg.Connection, query: str, *args: Any, **kw: Any) -> Any:
        if query.endswith("SAVEPOINT oncely_task") and query.startswith("BEGIN"):
            seen.seen["group begun"] += 1
        elif "RELEASE SAVEPOINT oncely_task" in query and "oncely_task_ack" in query:
            seen.seen["acked in a group"] += 1
        return await execute(self, query, *args, **kw)

    monkeypatch.setattr(asyncpg.Connection, "execute", counting)
    return seen


async def tasks_by_n(app: Oncely) -> dict[int, Any]:
    """Each task's row (state, attempt, and the transaction ids of its row and its effect),
    by its `n`."""
    async with app.store.engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT t.id, t.state, t.attempt, CAST(t.args AS jsonb) ->> 'n' AS n,"
                " t.xmin::text AS acked_in,"
                " (SELECT e.xmin::text FROM effects e"
                "   WHERE e.n = CAST(CAST(t.args AS jsonb) ->> 'n' AS int)) AS effect_in"
                " FROM oncely_tasks t"
            )
        )
        return {int(r.n): r for r in rows}


def test_group_is_an_option_from_1_to_50() -> None:
    assert WorkerOptions().group == 1  # off by default: each task in its own transaction
    assert WorkerOptions(group=50).group == 50
    for bad in (0, 51):
        with pytest.raises(BadInputError, match="group"):
            WorkerOptions(group=bad)


async def test_grouped_drain_runs_every_task_once_with_its_effect_in_its_ack_transaction(
    pg_app: Oncely, messages: Messages
) -> None:
    calls: collections.Counter[int] = collections.Counter()

    @pg_app.task
    async def write(db: Any, n: int) -> None:
        calls[n] += 1
        await db.execute(INSERT, {"n": n})

    await in_tx(pg_app, lambda db: write.enqueue_many(db, [{"n": n} for n in range(200)]))
    await drain(pg_app, lambda: all_ended(pg_app), concurrency=4, group=10)

    assert await effects(pg_app) == list(range(200))
    assert calls == {n: 1 for n in range(200)}
    rows = await tasks_by_n(pg_app)
    assert {r.state for r in rows.values()} == {"succeeded"}
    # Each effect was written in the same (sub)transaction as its task's ack.
    assert all(r.acked_in == r.effect_in for r in rows.values())
    # The tasks ran in groups: far fewer transactions begun than tasks acked in them.
    assert messages.seen["acked in a group"] >= 100
    assert messages.seen["group begun"] <= messages.seen["acked in a group"] // 2


async def test_grouping_off_runs_no_group(pg_app: Oncely, messages: Messages) -> None:
    @pg_app.task
    async def write(db: Any, n: int) -> None:
        await db.execute(INSERT, {"n": n})

    await in_tx(pg_app, lambda db: write.enqueue_many(db, [{"n": n} for n in range(50)]))
    await drain(pg_app, lambda: all_ended(pg_app), concurrency=2)
    assert await effects(pg_app) == list(range(50))
    assert messages.seen == {}


async def test_a_group_whose_tasks_make_no_statement_begins_no_transaction(
    pg_app: Oncely, messages: Messages, recorded: Any
) -> None:
    ran: list[int] = []

    @pg_app.task
    async def quiet(db: Any, n: int) -> None:
        ran.append(n)

    @pg_app.task
    async def write(db: Any, n: int) -> None:
        await db.execute(INSERT, {"n": n})

    await in_tx(pg_app, lambda db: quiet.enqueue_many(db, [{"n": n} for n in range(20)]))
    # One lane, twenty tasks ready: groups of ten, none of whose tasks makes a statement.
    await drain(pg_app, lambda: all_ended(pg_app), concurrency=1, group=10)
    assert sorted(ran) == list(range(20))
    started = recorded.named("task.started")
    # The lease takes them as they come: most run grouped (one may run alone between two).
    assert len(started) == 20 and sum(bool(f.get("grouped")) for f in started) >= 10
    assert messages.seen["group begun"] == 0  # no BEGIN, no connection taken for them
    assert {r.state for r in (await tasks_by_n(pg_app)).values()} == {"succeeded"}

    # A group's first statement, wherever it comes, begins it: once per group.
    await in_tx(pg_app, lambda db: quiet.enqueue_many(db, [{"n": n} for n in range(20, 25)]))
    await in_tx(pg_app, lambda db: write.enqueue_many(db, [{"n": n} for n in range(25, 30)]))
    await drain(pg_app, lambda: all_ended(pg_app), concurrency=1, group=10)
    writes = [f for f in recorded.named("task.started") if f["task"] == "write"]
    grouped = sum(bool(f.get("grouped")) for f in writes)
    assert grouped >= 1 and messages.seen["acked in a group"] == grouped
    assert 1 <= messages.seen["group begun"] <= grouped
    assert await effects(pg_app) == list(range(25, 30))


async def test_a_task_that_raises_mid_group_rolls_back_alone_and_retries(
    pg_app: Oncely, messages: Messages
) -> None:
    calls: collections.Counter[int] = collections.Counter()

    @pg_app.task(retry=RetryPolicy(attempts=3, wait=0.05, backoff="fixed", jitter=0))
    async def write(db: Any, n: int) -> None:
        calls[n] += 1
        await db.execute(INSERT, {"n": n})
        if n == 5 and calls[n] == 1:
            raise Boom("task 5 fails once, after its insert")

    await in_tx(pg_app, lambda db: write.enqueue_many(db, [{"n": n} for n in range(10)]))
    # One lane, ten tasks ready: one group of ten.
    await drain(pg_app, lambda: all_ended(pg_app), concurrency=1, group=10)

    assert messages.seen["group begun"] >= 1
    assert calls == {n: 2 if n == 5 else 1 for n in range(10)}  # neighbours ran once
    assert await effects(pg_app) == list(range(10))  # task 5's first insert rolled back
    rows = await tasks_by_n(pg_app)
    assert {n: (r.state, r.attempt) for n, r in rows.items()} == {
        n: ("succeeded", 2 if n == 5 else 1) for n in range(10)
    }
    errors = (await pg_app.task_errors(rows[5].id)).errors
    assert [e.attempt for e in errors] == [1]
    assert "Boom: task 5 fails once" in errors[0].error


async def test_a_task_whose_lease_was_lost_mid_group_is_rolled_back_and_not_acked(
    pg_app: Oncely, recorded: Any
) -> None:
    @pg_app.task
    async def write(db: Any, n: int, steal: bool = False) -> None:
        await db.execute(INSERT, {"n": n})
        if steal:  # another worker takes the task over meanwhile
            async with pg_app.store.engine.begin() as conn:
                await conn.execute(
                    sa.text(
                        "UPDATE oncely_tasks SET lease_token = 'ffff.1'"
                        " WHERE CAST(args AS jsonb) ->> 'n' = '3'"
                    )
                )

    entries = [{"n": n, "steal": n == 3} for n in range(6)]
    await in_tx(pg_app, lambda db: write.enqueue_many(db, entries))

    async def ended() -> bool:
        rows = await tasks_by_n(pg_app)
        return all(r.state == "succeeded" for n, r in rows.items() if n != 3)

    await drain(pg_app, ended, concurrency=1, group=6)
    assert await effects(pg_app) == [0, 1, 2, 4, 5]  # task 3's insert rolled back
    rows = await tasks_by_n(pg_app)
    assert rows[3].state == "running"  # the other worker's now, not acked by this one
    assert [f["id"] for f in recorded.named("task.lease_lost")] == [rows[3].id]


async def test_a_group_whose_commit_fails_runs_every_task_again_once(
    pg_app: Oncely, recorded: Any, messages: Messages
) -> None:
    calls: collections.Counter[int] = collections.Counter()

    @pg_app.task
    async def write(db: Any, n: int) -> None:
        calls[n] += 1
        await db.execute(INSERT, {"n": n})

    # A deferred constraint trigger that fails the first COMMIT it meets (a sequence is not
    # rolled back with it), and no later one.
    async with pg_app.store.engine.begin() as conn:
        for ddl in (
            "CREATE SEQUENCE commit_trap",
            "CREATE FUNCTION fail_first_commit() RETURNS trigger AS $$ BEGIN"
            " IF nextval('commit_trap') = 1 THEN RAISE EXCEPTION 'this COMMIT fails'; END IF;"
            " RETURN NULL; END $$ LANGUAGE plpgsql",
            "CREATE CONSTRAINT TRIGGER fail_first_commit AFTER INSERT ON effects"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_first_commit()",
        ):
            await conn.execute(sa.text(ddl))

    await in_tx(pg_app, lambda db: write.enqueue_many(db, [{"n": n} for n in range(8)]))
    await drain(pg_app, lambda: all_ended(pg_app), concurrency=1, group=8)

    failed = recorded.named("task.group_failed")
    assert len(failed) == 1 and failed[0]["tasks"] == 8
    assert "this COMMIT fails" in failed[0]["error"]
    assert calls == {n: 2 for n in range(8)}  # the group's run, then each one alone
    assert await effects(pg_app) == list(range(8))  # each once
    rows = await tasks_by_n(pg_app)
    # Nothing of the group landed: each task's attempt is the same one, acked once.
    assert {n: (r.state, r.attempt) for n, r in rows.items()} == {
        n: ("succeeded", 1) for n in range(8)
    }
    assert messages.seen["group begun"] == 1


async def test_a_cancel_mid_group_discards_that_task_and_runs_its_neighbours_again_once(
    pg_app: Oncely,
) -> None:
    calls: collections.Counter[int] = collections.Counter()
    started = asyncio.Event()

    @pg_app.task
    async def write(db: Any, n: int, stuck: bool = False) -> None:
        calls[n] += 1
        await db.execute(INSERT, {"n": n})
        if stuck:
            started.set()
            await asyncio.Event().wait()  # an HTTP call that never answers

    entries = [{"n": n, "stuck": n == 2} for n in range(5)]
    await in_tx(pg_app, lambda db: write.enqueue_many(db, entries))
    asked: list[int] = []

    async def done() -> bool:
        rows = await tasks_by_n(pg_app)
        if started.is_set() and not asked:
            answer, _ = await pg_app.cancel_task(rows[2].id, actor="test", reason="stuck")
            assert answer == "cancel requested"
            asked.append(rows[2].id)
        return [r.state for _, r in sorted(rows.items())] == [
            "succeeded",
            "succeeded",
            "discarded",
            "succeeded",
            "succeeded",
        ]

    await drain(pg_app, done, timeout=60, concurrency=1, group=5)
    # The group rolled back whole: tasks 0 and 1 ran again, 3 and 4 once; each effect once.
    assert calls == {0: 2, 1: 2, 2: 1, 3: 1, 4: 1}
    assert await effects(pg_app) == [0, 1, 3, 4]


async def test_sync_and_timed_tasks_are_not_grouped(pg_app: Oncely, recorded: Any) -> None:
    @pg_app.task(timeout=30)
    async def timed(db: Any, n: int) -> None:
        await db.execute(INSERT, {"n": n})

    @pg_app.task
    def plain(db: Any, n: int) -> None:
        db.execute(INSERT, {"n": n})

    await in_tx(pg_app, lambda db: timed.enqueue_many(db, [{"n": n} for n in range(10)]))
    await in_tx(pg_app, lambda db: plain.enqueue_many(db, [{"n": n} for n in range(10, 20)]))
    await drain(pg_app, lambda: all_ended(pg_app), concurrency=1, group=10)
    assert await effects(pg_app) == list(range(20))
    started = recorded.named("task.started")
    assert len(started) == 20 and not any(f.get("grouped") for f in started)


# -- a real worker process, SIGKILLed mid-group -----------------------------------------


@pytest.fixture
def pg_env(postgres_database: str, tmp_path: Path) -> dict[str, str]:
    _reset_postgres(postgres_database)
    env = {"ONCELY_DATABASE_URL": postgres_database, "ONCELY_TEST_SIGNALS": str(tmp_path)}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    engine = sa.create_engine(_sync_url(postgres_database))
    with engine.begin() as conn:
        conn.exec_driver_sql(EFFECTS_DDL)
    engine.dispose()
    return env


def test_a_worker_sigkilled_mid_group_commits_nothing_of_it_and_each_task_runs_once(
    pg_env: dict[str, str], postgres_database: str, tmp_path: Path
) -> None:
    engine = sa.create_engine(_sync_url(postgres_database))

    def rows(query: str) -> list[tuple[Any, ...]]:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(query))]

    try:
        with Session(engine) as session, session.begin():
            for n in range(1, 5):
                record.enqueue_sync(session, n=n)
            hang.enqueue_sync(session, n=5)  # writes, then waits for `release`
            for n in range(6, 11):
                record.enqueue_sync(session, n=n)
        args = ("--app", "tests.apps.queue_app:app", "worker", "--concurrency", "1")
        first = start_cli(*args, "--group", "10", "--lease", "1", env=pg_env)
        wait_until(lambda: sorted(tmp_path.glob("started-5-*")), "the group's fifth task")
        # Tasks 1-4 ran and acked inside the group's open transaction: nothing landed yet.
        assert rows("SELECT n FROM effects") == []
        assert rows("SELECT count(*) FROM oncely_tasks WHERE state = 'succeeded'") == [(0,)]
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
        assert rows("SELECT n FROM effects") == []

        (tmp_path / "release").touch()
        second = start_cli(*args, "--group", "10", "--lease", "1", env=pg_env)
        wait_until(
            lambda: rows("SELECT count(*) FROM oncely_tasks WHERE state = 'succeeded'") == [(10,)],
            "the second worker to run every task",
            deadline=120,
        )
        code, err = stop(second)
        assert code == 0, err
        assert rows("SELECT n, pid FROM effects ORDER BY n") == [
            (n, second.pid) for n in range(1, 11)
        ]
        assert rows("SELECT DISTINCT state FROM oncely_tasks") == [(TaskState.SUCCEEDED.value,)]
    finally:
        engine.dispose()
