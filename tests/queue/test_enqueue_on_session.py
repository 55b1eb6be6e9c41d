"""Enqueue and claim on the user's own AsyncSession, on asyncpg, psycopg and SQLite.

On asyncpg the statement goes straight to the session's driver connection (no SQLAlchemy
statement of oncely's): these tests hold it to the same promise as through SQLAlchemy
(guarantees 1, 2 and 6): the task or the claim exists iff the session's transaction commits,
whether oncely's statement is the session's first or comes after its own work, and the
session's pending ORM objects are neither flushed nor lost.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from oncely import Oncely, RetryPolicy, TaskState, claim_run
from oncely.queue import list_tasks

DRIVERS = ["sqlite", pytest.param("asyncpg", marks=pytest.mark.postgres)]
DRIVERS.append(pytest.param("psycopg", marks=pytest.mark.postgres))


class Base(DeclarativeBase):
    pass


class Note(Base):
    __tablename__ = "notes"
    id: Mapped[int] = mapped_column(primary_key=True)
    text: Mapped[str] = mapped_column(sa.String(50))


@dataclass
class User:
    """The user's own engine (not oncely's) and the oncely statements SQLAlchemy sent on it."""

    app: Oncely
    engine: AsyncEngine
    driver: str
    sent: list[str] = field(default_factory=list)

    def session(self) -> AsyncSession:
        return AsyncSession(self.engine, expire_on_commit=False)

    async def count(self, table: str) -> int:
        async with self.engine.connect() as conn:
            return int((await conn.execute(sa.text(f"SELECT count(*) FROM {table}"))).scalar())


def _urls(driver: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, str]:
    """oncely's URL for the app and the user's, with the driver under test."""
    if driver == "sqlite":
        path = tmp_path / "oncely.db"
        return f"sqlite:///{path}", f"sqlite+aiosqlite:///{path}"
    from tests.conftest import _reset_postgres

    server: str = request.getfixturevalue("postgres_database")
    _reset_postgres(server)
    return server, make_url(server).set(drivername=f"postgresql+{driver}").render_as_string(False)


@pytest.fixture(params=DRIVERS)
async def user(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[User]:
    app_url, url = _urls(request.param, tmp_path, request)
    app = Oncely(app_url)
    await app.migrate()
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    found = User(app, engine, request.param)

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "oncely_" in statement:
            found.sent.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", seen)
    try:
        yield found
    finally:
        await engine.dispose()
        await app.aclose()


def _charge(app: Oncely) -> Any:
    @app.task
    async def charge(db: Any, order_id: int) -> None:
        pass

    return charge


async def test_enqueue_as_the_first_statement_then_rollback_no_task(user: User) -> None:
    charge = _charge(user.app)
    async with user.session() as db, db.begin():
        await charge.enqueue(db, order_id=1)  # before SQLAlchemy has sent its BEGIN
        await charge.enqueue_many(db, [{"order_id": 2}, {"order_id": 3}])
        db.add(Note(text="paid"))
        await db.flush()
        await db.rollback()
    assert (await user.count("oncely_tasks"), await user.count("notes")) == (0, 0)


async def test_enqueue_after_the_sessions_work_commits_with_it(user: User) -> None:
    charge = _charge(user.app)
    async with user.session() as db, db.begin():
        db.add(Note(text="paid"))
        await db.flush()
        first = await charge.enqueue(db, order_id=1, idempotency_key="charge:1")
        again = await charge.enqueue(db, order_id=1, idempotency_key="charge:1")
        many = await charge.enqueue_many(db, [{"order_id": 2}, {"order_id": 3}])
        assert await user.count("oncely_tasks") == 0  # not committed: no one else sees them
    assert (first.duplicate, again.duplicate, again.id) == (False, True, first.id)
    assert [r.args["order_id"] for r in many] == [2, 3]
    assert (await user.count("oncely_tasks"), await user.count("notes")) == (3, 1)
    rows = await list_tasks(user.app)
    assert sorted(r.args["order_id"] for r in rows) == [1, 2, 3]
    assert {r.state for r in rows} == {TaskState.AVAILABLE}


async def test_enqueue_autoflushes_pending_objects_as_a_session_statement_does(
    user: User,
) -> None:
    """The session's pending objects are written before the task, as `session.execute` of
    the same INSERT writes them, on every driver; under `no_autoflush` they stay pending."""
    charge = _charge(user.app)
    async with user.session() as db, db.begin():
        note = Note(text="flushed")
        db.add(note)
        await charge.enqueue(db, order_id=1)
        assert note not in db.new and note.id is not None
        with db.no_autoflush:
            later = Note(text="pending")
            db.add(later)
            await charge.enqueue(db, order_id=2)
            assert later in db.new
    assert (await user.count("oncely_tasks"), await user.count("notes")) == (2, 2)
    async with user.session() as db, db.begin():
        db.add(Note(text="rolled back"))
        await charge.enqueue(db, order_id=3)
        await db.rollback()
    assert (await user.count("oncely_tasks"), await user.count("notes")) == (2, 2)


async def test_failure_frees_the_slot_claim_run_on_the_users_session(user: User) -> None:
    async with user.session() as db, db.begin():
        assert await claim_run(db, "close", "2026-W48") is True  # the first statement
        db.add(Note(text="bonus"))
        await db.flush()
        await db.rollback()
    assert (await user.count("oncely_runs"), await user.count("notes")) == (0, 0)
    async with user.session() as db, db.begin():
        db.add(Note(text="bonus"))
        await db.flush()
        assert await claim_run(db, "close", "2026-W48") is True  # after the session's work
    async with user.session() as db, db.begin():
        assert await claim_run(db, "close", "2026-W48") is False
    assert (await user.count("oncely_runs"), await user.count("notes")) == (1, 1)


async def test_on_asyncpg_oncely_sends_its_statements_on_the_driver(user: User) -> None:
    """On asyncpg, no oncely statement passes through SQLAlchemy; elsewhere all of them do."""
    charge = _charge(user.app)
    async with user.session() as db, db.begin():
        await charge.enqueue(db, order_id=1)
        await charge.enqueue_many(db, [{"order_id": 2}, {"order_id": 3}])
        await claim_run(db, "close", "2026-W48")
    sent = list(user.sent)
    assert await user.count("oncely_tasks") == 3
    if user.driver == "asyncpg":
        assert sent == []
    else:
        assert len(sent) == 3, sent


async def test_claim_run_on_an_autocommit_session_commits_by_itself(user: User) -> None:
    auto = user.engine.execution_options(isolation_level="AUTOCOMMIT")
    async with AsyncSession(auto) as db:
        assert await claim_run(db, "close", "2026-W48") is True
        assert await user.count("oncely_runs") == 1  # seen from another connection at once
        assert await claim_run(db, "close", "2026-W48") is False


async def test_a_task_that_enqueues_then_fails_leaves_no_task(user: User) -> None:
    """In a worker's batch, a failing task's enqueue rolls back with the rest of its work."""
    from queue_helpers import drain  # type: ignore[import-not-found]

    app = user.app

    @app.task
    async def second(db: Any, n: int) -> None:
        pass

    @app.task(retry=RetryPolicy(attempts=1))
    async def first(db: Any, n: int) -> None:
        await second.enqueue(db, n=n)
        raise RuntimeError("after the enqueue")

    @app.task
    async def neighbour(db: Any, n: int) -> None:
        await second.enqueue(db, n=n)

    async with user.session() as db, db.begin():
        await first.enqueue(db, n=1)
        await neighbour.enqueue(db, n=2)

    async def done() -> bool:
        states = {r.task: r.state for r in await list_tasks(app)}
        return states.get("first") is TaskState.DEAD and "second" in states

    await drain(app, done)
    seconds = [r.args["n"] for r in await list_tasks(app) if r.task == "second"]
    assert seconds == [2]


async def test_a_job_that_enqueues_then_fails_leaves_no_task_and_no_claim(user: User) -> None:
    """In `app.run` (on asyncpg: oncely's own transaction on the driver), a job's enqueue
    commits with its claim, or neither does."""
    from datetime import datetime, timezone

    from oncely import RunStatus, every

    app = user.app
    charge = _charge(app)
    fail = {"now": True}

    @app.job(every(hours=1), name="billing")
    async def billing(db: Any, now: datetime) -> None:
        await charge.enqueue(db, order_id=1, idempotency_key=f"bill:{now.isoformat()}")
        if fail["now"]:
            raise RuntimeError("after the enqueue")

    slot = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)
    with pytest.raises(RuntimeError, match="after the enqueue"):
        await app.run("billing", now=slot)
    assert (await user.count("oncely_tasks"), await user.count("oncely_runs")) == (0, 0)
    fail["now"] = False
    # The failure freed the slot: the retry runs it, and the task commits with its claim.
    assert (await app.run("billing", now=slot)).status is RunStatus.RAN
    assert (await user.count("oncely_tasks"), await user.count("oncely_runs")) == (1, 1)
