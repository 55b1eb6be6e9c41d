"""app.effect / app.effect_sync / @app.once on SQLite and Postgres: a duplicate skips the body
(and says so in its result, a log event and the observers that metrics use); an exception
rolls back and frees the key; the body cannot end oncely's transaction."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import sqlalchemy as sa

from oncely import (
    BadInputError,
    ConfigError,
    JobTransactionError,
    Oncely,
    RunStatus,
    SchemaMissingError,
    events,
)

INSERT = sa.text("INSERT INTO ledger_effects (k) VALUES (:k)")


@pytest.fixture
async def app(db_url: str, sync_engine: sa.Engine) -> AsyncIterator[Oncely]:
    app = Oncely(db_url)
    await app.migrate()
    with sync_engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE ledger_effects (k varchar(50))")
    yield app
    await app.aclose()


@pytest.fixture
def observed() -> Any:
    seen: list[tuple[str, Mapping[str, Any]]] = []

    def observer(event: str, fields: Mapping[str, Any]) -> None:
        seen.append((event, fields))

    events.subscribe(observer)
    yield seen
    events.unsubscribe(observer)


def rows(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(sa.text("SELECT k FROM ledger_effects ORDER BY k"))]


async def test_a_duplicate_skips_the_body_and_says_so(
    app: Oncely, sync_engine: sa.Engine, observed: Any, caplog: pytest.LogCaptureFixture
) -> None:
    first = app.effect("charge:42")
    async with first as db:
        assert db is not None
        await db.execute(INSERT, {"k": "charge:42"})
    again = app.effect("charge:42")
    with caplog.at_level(logging.INFO, logger="oncely"):
        async with again as db:
            assert db is None
    assert rows(sync_engine) == ["charge:42"]
    assert first.result is not None and first.result.status is RunStatus.RAN
    assert again.result is not None and again.result.skipped
    assert again.result.claim is not None and again.result.claim.job == "@effect"
    assert "effect.skipped: already processed, skipping" in caplog.text
    assert "key=charge:42" in caplog.text
    skipped = [f for e, f in observed if e == "effect.skipped"]
    assert len(skipped) == 1 and skipped[0]["key"] == "charge:42"
    assert [e for e, _ in observed] == ["effect.ran", "effect.skipped"]
    history = await app.history("@effect")
    assert [(c.job, c.key) for c in history] == [("@effect", "charge:42")]
    assert history[0].finished_at is not None and history[0].scheduled_for is None


async def test_an_exception_rolls_back_and_frees_the_key(
    app: Oncely, sync_engine: sa.Engine, observed: Any
) -> None:
    effect = app.effect("charge:42")
    with pytest.raises(RuntimeError, match="gateway down"):
        async with effect as db:
            assert db is not None
            await db.execute(INSERT, {"k": "first"})
            raise RuntimeError("gateway down")
    assert effect.result is not None and effect.result.status is RunStatus.FAILED
    assert rows(sync_engine) == [] and await app.history("@effect") == []
    async with app.effect("charge:42") as db:  # the redelivery runs clean
        assert db is not None
        await db.execute(INSERT, {"k": "retry"})
    assert rows(sync_engine) == ["retry"]
    assert [e for e, _ in observed] == ["effect.failed", "effect.ran"]


def test_the_sync_form(app: Oncely, sync_engine: sa.Engine) -> None:
    with app.effect_sync("mail:1") as session:
        assert session is not None
        session.execute(INSERT, {"k": "mail:1"})
    with pytest.raises(ValueError), app.effect_sync("mail:2") as session:
        assert session is not None
        session.execute(INSERT, {"k": "mail:2"})
        raise ValueError("bounced")
    skipped = app.effect_sync("mail:1")
    with skipped as session:
        assert session is None
    assert skipped.result is not None and skipped.result.skipped
    assert rows(sync_engine) == ["mail:1"]


async def test_once_decorator_async_and_sync(app: Oncely, sync_engine: sa.Engine) -> None:
    calls: list[int] = []

    @app.once(key=lambda order_id: f"charge:{order_id}")
    async def charge(db: Any, order_id: int) -> str:
        calls.append(order_id)
        await db.execute(INSERT, {"k": f"charge:{order_id}"})
        return f"ch_{order_id}"

    @app.once(key=lambda to, *, subject: f"mail:{to}:{subject}", scope="emails")
    def send(session: Any, to: str, *, subject: str) -> None:
        calls.append(-1)
        session.execute(INSERT, {"k": f"mail:{to}"})

    ran = await charge(42)
    dup = await charge(42)
    assert (ran.status, ran.value, dup.status, dup.value) == (
        RunStatus.RAN,
        "ch_42",
        RunStatus.SKIPPED,
        None,
    )
    assert (await asyncio.to_thread(send, "ana", subject="hi")).ran
    assert (await asyncio.to_thread(send, "ana", subject="hi")).skipped
    assert calls == [42, -1]
    assert charge.key_for(42) == "charge:42" and charge.__name__ == "charge"
    assert rows(sync_engine) == ["charge:42", "mail:ana"]
    assert {c.job for c in await app.history()} == {"@effect", "@emails"}


async def test_the_same_key_in_two_scopes_runs_twice(app: Oncely) -> None:
    async with app.effect("42") as a:
        assert a is not None
    async with app.effect("42", scope="refunds") as b:
        assert b is not None


async def test_concurrent_duplicates_one_runs(app: Oncely, sync_engine: sa.Engine) -> None:
    @app.once(key=lambda n: "same")
    async def handler(db: Any, n: int) -> None:
        await db.execute(INSERT, {"k": f"h{n}"})

    results = await asyncio.gather(*(handler(n) for n in range(4)))
    assert sorted(r.status.value for r in results) == ["ran", "skipped", "skipped", "skipped"]
    assert len(rows(sync_engine)) == 1


async def test_the_body_must_not_commit(app: Oncely, sync_engine: sa.Engine) -> None:
    with pytest.raises(JobTransactionError, match="commit"):
        async with app.effect("k") as db:
            assert db is not None
            await db.execute(INSERT, {"k": "k"})
            await db.commit()
    with pytest.raises(JobTransactionError, match="commit"), app.effect_sync("k2") as session:
        assert session is not None
        session.execute(INSERT, {"k": "k2"})
        session.commit()
    assert rows(sync_engine) == [] and await app.history("@effect") == []


async def test_bad_keys_and_scopes_are_refused(app: Oncely) -> None:
    for key in ("", None, 42, "x" * 201):
        with pytest.raises(BadInputError, match="key"):
            app.effect(key)  # type: ignore[arg-type]
    with pytest.raises(BadInputError, match="idempotency_key"):
        app.effect_sync("x" * 201)
    with pytest.raises(ConfigError, match="scope"):
        app.effect("k", scope="@bad")
    with pytest.raises(ConfigError, match="key="):
        app.once(key="charge:{order_id}")  # type: ignore[arg-type]

    @app.once(key=lambda n: "")
    async def handler(db: Any, n: int) -> None:
        raise AssertionError("never called")

    with pytest.raises(BadInputError, match="non-empty"):
        await handler(1)
    assert await app.history() == []


async def test_missing_schema_is_a_clear_error(db_url: str) -> None:
    app = Oncely(db_url)
    try:
        with pytest.raises(SchemaMissingError, match="oncely migrate"):
            async with app.effect("k"):
                pass
        with pytest.raises(SchemaMissingError, match="oncely migrate"), app.effect_sync("k"):
            pass
    finally:
        await app.aclose()


def test_a_once_handler_looks_like_the_call_it_takes(db_url: str) -> None:
    """Callers (and Celery's argument check) see the signature without the session."""
    import inspect

    app = Oncely(db_url)

    @app.once(key=lambda order_id, amount=10: f"charge:{order_id}")
    def charge(db: Any, order_id: int, amount: int = 10) -> str:
        """Charge an order."""
        return "x"

    signature = inspect.signature(charge)
    assert list(signature.parameters) == ["order_id", "amount"]
    assert signature.parameters["amount"].default == 10
    assert charge.__doc__ == "Charge an order." and charge.__wrapped__ is not None
    with pytest.raises(ConfigError, match="first parameter receives the session"):

        @app.once(key=lambda: "k")
        def no_session() -> None:
            pass


async def test_effects_show_in_history_and_can_be_released(
    app: Oncely, db_url: str, tmp_path: Any
) -> None:
    from tests.support import ROOT, run_cli

    async with app.effect("charge:42") as db:
        assert db is not None
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_APP": "tests.apps.shop:app"}
    history = run_cli("history", "@effect", cwd=ROOT, env=env)
    assert history.returncode == 0, history.stderr
    assert "@effect" in history.stdout and "charge:42" in history.stdout
    released = run_cli("release", "@effect", "charge:42", cwd=ROOT, env=env)
    assert released.returncode == 0 and "released @effect key charge:42" in released.stdout
    async with app.effect("charge:42") as db:  # free again
        assert db is not None


async def test_events_name_the_effect_for_metrics(app: Oncely, observed: Any) -> None:
    """Metrics label effects by the once-handler's name (else the scope), never by the key."""

    @app.once(key=lambda n: f"k:{n}")
    async def refund(db: Any, n: int) -> None:
        pass

    await refund(1)
    await refund(1)
    async with app.effect("k:2", scope="mail"):
        pass
    assert [(e, f["effect"], f["job"], f["key"]) for e, f in observed] == [
        ("effect.ran", refund.name, "@effect", "k:1"),
        ("effect.skipped", refund.name, "@effect", "k:1"),
        ("effect.ran", "mail", "@mail", "k:2"),
    ]
    assert refund.name.endswith("refund")
