"""Guarantee 6, enqueue side: a task exists iff the caller's transaction commits; idempotency
keys make re-enqueueing harmless and observable; bad payloads change nothing (guarantee 8)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import sqlalchemy as sa
from queue_helpers import effects, in_tx  # type: ignore[import-not-found]
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from oncely import BadInputError, ConfigError, Oncely, PayloadError, SchemaMissingError, TaskState
from oncely.queue import list_tasks


def _tasks(app: Oncely):  # type: ignore[no-untyped-def]
    @app.task
    async def charge(db, order_id: int, amount: float = 0.0, meta: dict | None = None):  # type: ignore[no-untyped-def,type-arg]
        pass

    return charge


async def count(app: Oncely) -> int:
    return len(await list_tasks(app, limit=100000))


async def test_queue_tasks_take_effect_once_enqueue_then_rollback_no_task(app: Oncely) -> None:
    charge = _tasks(app)
    async with AsyncSession(app.store.engine) as db, db.begin():
        rec = await charge.enqueue(db, order_id=1)
        assert rec.state is TaskState.AVAILABLE and rec.args == {"order_id": 1}
        await db.rollback()
    assert await count(app) == 0
    await in_tx(app, lambda db: charge.enqueue(db, order_id=2))
    (only,) = await list_tasks(app)
    assert only.args == {"order_id": 2} and only.task == "charge" and only.attempt == 0


async def test_duplicates_are_observable_same_idempotency_key_twice(app: Oncely, recorded) -> None:  # type: ignore[no-untyped-def]
    charge = _tasks(app)
    first = await in_tx(app, lambda db: charge.enqueue(db, order_id=42, idempotency_key="c:42"))
    second = await in_tx(app, lambda db: charge.enqueue(db, order_id=42, idempotency_key="c:42"))
    assert not first.duplicate and second.duplicate and second.id == first.id
    assert await count(app) == 1
    (dup,) = recorded.named("task.duplicate")
    assert dup == {
        "task": "charge",
        "id": first.id,
        "idempotency_key": "c:42",
        "state": "available",
    }
    # The key is unique among all retained tasks, not only active ones.
    async with app.store.engine.begin() as conn:
        await conn.execute(sa.text("UPDATE oncely_tasks SET state = 'succeeded'"))
    third = await in_tx(app, lambda db: charge.enqueue(db, order_id=42, idempotency_key="c:42"))
    assert third.duplicate and third.state is TaskState.SUCCEEDED and await count(app) == 1

    # The same key under another task is another task.
    @app.task
    async def refund(db, order_id: int):  # type: ignore[no-untyped-def]
        pass

    other = await in_tx(app, lambda db: refund.enqueue(db, order_id=42, idempotency_key="c:42"))
    assert not other.duplicate and await count(app) == 2


async def test_enqueue_many_one_statement_with_keys(app: Oncely, recorded) -> None:  # type: ignore[no-untyped-def]
    charge = _tasks(app)
    await in_tx(app, lambda db: charge.enqueue(db, order_id=1, idempotency_key="k1"))
    items = [
        {"order_id": 1, "idempotency_key": "k1"},
        {"order_id": 2},
        {"order_id": 3, "idempotency_key": "k3"},
        {"order_id": 3, "idempotency_key": "k3"},
        {"order_id": 4, "delay": 3600},
    ]
    recs = await in_tx(app, lambda db: charge.enqueue_many(db, items))
    assert [r.args["order_id"] for r in recs] == [1, 2, 3, 3, 4]
    assert [r.duplicate for r in recs] == [True, False, False, True, False]
    assert recs[2].id == recs[3].id
    assert await count(app) == 4
    assert recs[4].run_at > recs[1].run_at + timedelta(minutes=59)
    assert len(recorded.named("task.duplicate")) == 2


def test_enqueue_sync_in_a_plain_session(app: Oncely, sync_engine: sa.Engine) -> None:
    charge = _tasks(app)
    with Session(sync_engine) as session:
        with session.begin():
            rec = charge.enqueue_sync(session, order_id=7, idempotency_key="s7")
        with session.begin():
            again = charge.enqueue_sync(session, order_id=7, idempotency_key="s7")
        with session.begin():
            charge.enqueue_sync(session, order_id=8)
            session.rollback()
    assert again.duplicate and again.id == rec.id
    with sync_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM oncely_tasks")).scalar_one() == 1


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"order_id": datetime.now(timezone.utc)}, "argument 'order_id' is a datetime"),
        ({"order_id": 1, "meta": {"when": {1, 2}}}, "argument 'meta'['when'] is a set"),
        ({"order_id": 1, "amount": math.nan}, "argument 'amount' is nan"),
        ({"order_id": 1, "amount": Decimal("1.5")}, "argument 'amount' is a Decimal"),
        ({"order_id": (1, 2)}, "argument 'order_id' is a tuple"),
        ({"order_id": 1, "meta": {3: "x"}}, "argument 'meta' has a key 3"),
        ({"order_id": 1, "currency": "MXN"}, "cannot take these arguments"),
        ({}, "cannot take these arguments"),
    ],
)
async def test_bad_input_gets_a_clear_error_non_json_task_args(
    app: Oncely, kwargs: dict[str, object], named: str
) -> None:
    charge = _tasks(app)
    with pytest.raises(PayloadError, match="task 'charge'") as info:
        await in_tx(app, lambda db: charge.enqueue(db, **kwargs))
    assert named in str(info.value)
    with pytest.raises(PayloadError):
        await in_tx(app, lambda db: charge.enqueue_many(db, [{"order_id": 1}, kwargs]))
    assert await count(app) == 0


async def test_bad_input_gets_a_clear_error_enqueue_options(app: Oncely) -> None:
    charge = _tasks(app)
    naive = datetime(2026, 1, 1)
    for options, message in [
        ({"run_at": naive}, "timezone-aware"),
        ({"delay": -1}, "delay must be >= 0"),
        ({"delay": 1, "run_at": datetime.now(timezone.utc)}, "run_at or delay"),
        ({"at": naive}, "at must be a timezone-aware datetime"),
        ({"at": "2026-01-01T00:00:00Z"}, "at must be a timezone-aware datetime"),
        ({"delay": 1, "at": datetime.now(timezone.utc)}, "at or delay"),
        ({"at": datetime.now(timezone.utc), "run_at": datetime.now(timezone.utc)}, "at or run_at"),
        ({"idempotency_key": ""}, "idempotency_key"),
    ]:
        with pytest.raises(BadInputError, match=message):
            await in_tx(app, lambda db, o=options: charge.enqueue(db, order_id=1, **o))
    assert await count(app) == 0


def test_bad_input_gets_a_clear_error_task_declarations() -> None:
    app = Oncely("sqlite://")
    with pytest.raises(ConfigError, match="session first"):
        app.task(name="nothing")(lambda: None)
    with pytest.raises(ConfigError, match="not valid"):
        app.task(lambda db: None)
    with pytest.raises(ConfigError, match="reserved"):

        @app.task
        async def bad(db, idempotency_key: str):  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(ConfigError, match="RetryPolicy"):
        app.task(name="r", retry=3)(lambda db: None)  # type: ignore[arg-type]

    @app.task(name="twice")
    async def one(db):  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(ConfigError, match="registered twice"):
        app.task(name="twice")(lambda db: None)


async def test_bad_input_gets_a_clear_error_schema_missing(db_url: str) -> None:
    app = Oncely(db_url)
    charge = _tasks(app)
    with pytest.raises(SchemaMissingError, match="oncely migrate"):
        async with AsyncSession(app.store.engine) as db, db.begin():
            await charge.enqueue(db, order_id=1)
    await app.aclose()


async def test_enqueue_inside_a_task_commits_with_it(app: Oncely) -> None:
    """A task's own enqueue is part of its transaction (chains are once too)."""
    from queue_helpers import drain  # type: ignore[import-not-found]

    @app.task
    async def second(db, n: int):  # type: ignore[no-untyped-def]
        await db.execute(sa.text("INSERT INTO effects (n) VALUES (:n)"), {"n": n})

    @app.task
    async def first(db, n: int):  # type: ignore[no-untyped-def]
        await second.enqueue(db, n=n + 1, idempotency_key=f"after:{n}")

    await in_tx(app, lambda db: first.enqueue(db, n=1))

    async def done() -> bool:
        return await effects(app) == [2]

    await drain(app, done)
    states = sorted((r.task, r.state.value) for r in await list_tasks(app))
    assert states == [("first", "succeeded"), ("second", "succeeded")]


@pytest.mark.postgres
async def test_enqueue_on_an_autocommit_session_is_its_own_transaction(pg_app: Oncely) -> None:
    """With no transaction of the caller's (an AUTOCOMMIT session), the enqueue's one
    statement is the transaction: the task exists once it returns, a known key adds nothing."""
    app = pg_app
    charge = _tasks(app)
    auto = app.store.engine.execution_options(isolation_level="AUTOCOMMIT")
    async with AsyncSession(auto) as db:
        first = await charge.enqueue(db, order_id=1, idempotency_key="k")
        assert await count(app) == 1  # seen from another connection, before any commit
        again = await charge.enqueue(db, order_id=1, idempotency_key="k")
    assert (again.id, again.duplicate, first.duplicate) == (first.id, True, False)
    assert await count(app) == 1


@pytest.mark.postgres
async def test_enqueue_on_an_asyncpg_connection(pg_app: Oncely, recorded) -> None:  # type: ignore[no-untyped-def]
    """On a bare asyncpg connection: the task exists iff the caller's transaction commits,
    the records match a session's, known keys insert nothing, bad payloads send nothing."""
    import asyncpg

    app = pg_app
    charge = _tasks(app)
    dsn = app.store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await charge.enqueue(conn, order_id=1)
        tx = conn.transaction()
        await tx.start()
        await charge.enqueue(conn, order_id=2, idempotency_key="k2")
        await tx.rollback()  # the caller's rollback takes its task with it
        assert [r.args for r in await list_tasks(app)] == [{"order_id": 1}]

        async with conn.transaction():
            rec = await charge.enqueue(
                conn, order_id=3, meta={"a": [1, None]}, idempotency_key="k3"
            )
        (stored,) = [r for r in await list_tasks(app) if r.id == rec.id]
        assert rec == stored
        assert rec.state is TaskState.AVAILABLE and rec.queue == "default" and rec.attempt == 0

        via_session = await in_tx(
            app, lambda db: charge.enqueue(db, order_id=4, idempotency_key="k4")
        )
        async with conn.transaction():
            again = await charge.enqueue(conn, order_id=3, idempotency_key="k3")
            recs = await charge.enqueue_many(
                conn,
                [
                    {"order_id": 4, "idempotency_key": "k4"},
                    {"order_id": 5},
                    {"order_id": 6, "idempotency_key": "k6"},
                    {"order_id": 6, "idempotency_key": "k6"},
                    {"order_id": 7, "delay": 3600},
                ],
            )
        assert again.duplicate and again.id == rec.id and again.args == rec.args
        assert [r.args["order_id"] for r in recs] == [4, 5, 6, 6, 7]
        assert [r.duplicate for r in recs] == [True, False, False, True, False]
        assert recs[0].id == via_session.id and recs[2].id == recs[3].id
        assert recs[4].run_at > recs[1].run_at + timedelta(minutes=59)
        assert len(recorded.named("task.duplicate")) == 3
        assert await count(app) == 6  # 1, 3, 4, 5, 6, 7

        before = await count(app)
        with pytest.raises(PayloadError, match="argument 'order_id' is a datetime"):
            await charge.enqueue(conn, order_id=datetime.now(timezone.utc))
        assert await count(app) == before and not conn.is_in_transaction()
        # Outside a transaction the INSERT commits by itself, like an autocommit session.
        await charge.enqueue(conn, order_id=8)
        assert await count(app) == before + 1
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_enqueue_on_an_asyncpg_connection_without_the_schema(
    postgres_database: str,
) -> None:
    import asyncpg
    from tests.conftest import _reset_postgres

    _reset_postgres(postgres_database)
    app = Oncely(postgres_database)
    charge = _tasks(app)
    conn = await asyncpg.connect(postgres_database.replace("postgresql+asyncpg", "postgresql"))
    try:
        with pytest.raises(SchemaMissingError, match="oncely migrate"):
            await charge.enqueue(conn, order_id=1)
    finally:
        await conn.close()
        await app.aclose()
