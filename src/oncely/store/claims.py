"""The bare claim, on a caller's own transaction: the primitive everything else rests on.

The claim, the read of a claim and the stamp of a run's end are each written once, as a plan
(see `plan`), and run on synchronous and asynchronous sessions alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

from .. import hooks
from ..errors import BadInputError
from ..identity import replica_id
from ..model import Claim
from . import sql
from .database import Database
from .dialect import ClaimAnswer, ClaimRequest, Dialect, raise_translated
from .dialects import dialect_for, driver_dialect
from .held import HeldConnections
from .plan import Plan, run, run_async
from .rows import claim_from_row
from .session import (
    AttemptSession,
    attempt_driver,
    attempt_xact,
    claimed_here,
    end,
    set_attempt_driver,
    take_over,
)

RELEASE_BUSY_MS = 500
"""How long `release` waits on SQLite for the write lock before answering "running"."""


def claim_plan(dialect: Dialect, job: str, key: str, claimed_by: str) -> Plan[bool]:
    """Claim (job, key) in the open transaction; True if the claim is ours."""
    params = {
        "job": job,
        "key": key,
        "scheduled_for": None,
        "claimed_by": claimed_by,
        **dialect.now_params(),
    }
    row = (yield dialect.claim_statement, params).first()
    return row is not None


def claim_in_plan(job: str, key: str) -> Plan[Claim | None]:
    """The claim of (job, key) as the open transaction sees it."""
    row = (yield sql.get_claim(job, key), None).first()
    return claim_from_row(row) if row is not None else None


def finish_plan(dialect: Dialect, job: str, key: str) -> Plan[None]:
    """Stamp the end of the run claimed as (job, key), before its commit."""
    yield dialect.finish_statement, {"claim_job": job, "claim_key": key, **dialect.now_params()}


def fate_plan(
    dialect: Dialect, job: str, key: str, record: Callable[[int, Any], tuple[Any, Any]]
) -> Plan[None]:
    """A failed attempt's end, while its transaction still holds the slot: roll its work back
    to the savepoint taken after the claim, drop its claim, and write `record(tries, now)`
    (the statement of its end row, given how many marked attempts the slot had so far and
    database now). The caller commits."""
    yield sql.ROLLBACK_TO_SAVEPOINT, None
    yield sql.unclaim(job, key), None
    marks = (yield sql.slot_marks(job, key, dialect.now()), None).one()
    yield record(int(marks.tries), marks.now)


async def claim_run(session: AsyncSession | AsyncConnection | Any, job: str, key: str) -> bool:
    """Claim (job, key) in the caller's open transaction; True if the claim is ours.

    One `INSERT … ON CONFLICT DO NOTHING RETURNING 1`: the claim commits with the caller's
    work or not at all, and a rollback frees it. If another transaction holds an uncommitted
    claim on the same key, this waits for it to end (use `Oncely.run` for a non-blocking try).
    `session` is an AsyncSession, an AsyncConnection, or a bare asyncpg connection, which
    must be inside a transaction (`async with conn.transaction():`). On an AsyncSession over
    asyncpg the INSERT goes straight to the session's driver connection, in its transaction.
    """
    driver = driver_dialect(session)
    if driver is not None:
        return await driver.claim_on_driver(session, job, key, replica_id())
    if isinstance(session, AsyncSession):
        bind = await session.connection()
        dialect = dialect_for(bind.dialect.name)
        on_driver = await dialect.session_driver(session, bind)
        if on_driver is not None and on_driver.is_in_transaction():
            # The prepared INSERT on the session's driver connection, in its transaction.
            return await dialect.claim_on_driver(on_driver, job, key, replica_id())
    else:
        dialect = dialect_for(session.dialect.name)
    try:
        return await run_async(session, claim_plan(dialect, job, key, replica_id()))
    except DBAPIError as exc:
        raise_translated(dialect, exc)


def claim_run_sync(session: Session | Connection, job: str, key: str) -> bool:
    """The same claim as `claim_run`, for a synchronous Session or Connection (Django, Flask,
    scripts)."""
    bind = session.connection() if isinstance(session, Session) else session
    dialect = dialect_for(bind.dialect.name)
    try:
        return run(session, claim_plan(dialect, job, key, replica_id()))
    except DBAPIError as exc:
        raise_translated(dialect, exc)


class Claims:
    """The slot's side of the store: one attempt's session, its claim and its end, the
    effects' claims, the ledger of claims, and an operator's release of one."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.dialect = db.dialect
        self._attempts = async_sessionmaker(
            db.engine, sync_session_class=AttemptSession, expire_on_commit=False
        )
        # Where oncely runs an attempt's transaction on the driver itself (asyncpg), else None.
        self._driver_attempts = self.dialect.attempt_engine(db.engine)
        # Clean attempt connections kept for the next attempt, on oncely's own engine only.
        self._held = (
            HeldConnections() if db.owns_engine and self._driver_attempts is not None else None
        )

    async def close(self) -> None:
        """Close the attempt connections kept for the next attempt."""
        if self._held is not None:
            await self._held.close()

    # -- one attempt --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def attempt(self) -> AsyncIterator[AsyncSession]:
        """A fresh session for one attempt, closed (rolled back if still open) at the end.

        On asyncpg the attempt's transaction is begun here, on the driver, and the session
        runs inside it (see `Dialect.attempt_engine`); elsewhere the session begins it.
        """
        if self._driver_attempts is None:
            session = self._attempts()
            try:
                yield session
            finally:
                take_over(session.sync_session)
                with contextlib.suppress(Exception):
                    await session.close()
                end(session.sync_session)
            return
        conn = await self._held.take(self.dialect.reusable) if self._held is not None else None
        if conn is None:
            with self.db.translate():
                conn = await self._driver_attempts.connect()
        reusable = False
        try:
            with self.db.translate():
                driver = await self.dialect.begin_attempt(conn)
            session = self._attempts(bind=conn)
            set_attempt_driver(session, driver)
            try:
                yield session
            finally:
                take_over(session.sync_session)
                if session.in_transaction():
                    with contextlib.suppress(Exception):
                        await session.close()
                end(session.sync_session)
                with contextlib.suppress(Exception):
                    await self.dialect.rollback_attempt(driver)
                    reusable = (
                        self._held is not None
                        and not conn.in_transaction()
                        and await self.dialect.reusable(conn, 0.0)
                    )
        finally:
            # A transaction still open here (a failed rollback) is closed with the socket
            # when the connection is checked in (see postgres._close_if_open).
            if not (reusable and self._held is not None and self._held.keep(conn)):
                with contextlib.suppress(Exception):
                    await conn.close()

    async def lock_and_claim(self, session: AsyncSession, request: ClaimRequest) -> ClaimAnswer:
        """Open the attempt's transaction, take the slot's lock without queueing, and claim
        (see ClaimRequest for what `busy_ms` and `exclusive` ask)."""
        with self.db.translate():
            return await self.dialect.lock_and_claim(session, request)

    async def claim_in(self, session: AsyncSession, job: str, key: str) -> Claim | None:
        """The committed claim of a slot, read in the given session."""
        with self.db.translate():
            return await run_async(session, claim_in_plan(job, key))

    async def finish(self, session: AsyncSession, job: str, key: str) -> None:
        """Stamp the run's end on its claim and commit work and claim together."""
        driver = attempt_driver(session)
        with self.db.translate():
            if driver is None:
                await run_async(session, finish_plan(self.dialect, job, key))
                hooks.before_commit(job, key)
                take_over(session.sync_session)
                await session.commit()
                return
            if session.in_transaction() or session.new or session.dirty or session.deleted:
                await session.flush()  # the job's pending ORM changes, into the transaction
            hooks.before_commit(job, key)
            take_over(session.sync_session)
            await self.dialect.commit_attempt(driver, job, key, claimed_here(session, job, key))

    async def give_up(
        self,
        session: AsyncSession,
        job: str,
        key: str,
        record: Callable[[int, datetime], tuple[Any, Any]],
    ) -> None:
        """End a failed attempt in its own transaction while it still holds the slot: roll
        its work back to the savepoint taken after the claim, drop its claim, write its end
        row (`record(tries, now)`: the statement, given how many marked attempts the slot had
        and database now) and commit, so no replica slips in between."""
        driver = attempt_driver(session)
        take_over(session.sync_session)
        session.sync_session.expunge_all()  # the job's pending objects are not to be flushed
        with self.db.translate():
            await run_async(session, fate_plan(self.dialect, job, key, record))
            if driver is None:
                await session.commit()
            else:
                await driver.execute("COMMIT")

    def attempt_xact(self, session: AsyncSession) -> int | None:
        """The id of an attempt's transaction, read with its claim (Postgres, on the driver):
        what a lost COMMIT's fate is asked by; None where it was not read."""
        return attempt_xact(session)

    async def abandon(self, session: AsyncSession) -> None:
        """Roll the attempt back (claim included); a dead connection is already rolled back."""
        take_over(session.sync_session)
        driver = attempt_driver(session)
        with contextlib.suppress(Exception):
            if driver is None:
                await session.rollback()
            else:
                await self.dialect.rollback_attempt(driver)

    # -- effects: a key claimed by any caller (a queue's task body, a script) -----------

    async def claim_effect(
        self, session: AsyncSession, job: str, key: str, claimed_by: str
    ) -> bool:
        """Open the session's transaction and claim (job, key); True if the claim is ours.

        Unlike `lock_and_claim` this waits for a concurrent holder of the same key to finish
        (Postgres: the row lock; SQLite: the write lock, up to its busy timeout), so a
        concurrent duplicate ends as a skip once the first commits, or runs if it rolled back.
        """
        with self.db.translate():
            return await run_async(session, claim_plan(self.dialect, job, key, claimed_by))

    def claim_effect_sync(self, session: Session, job: str, key: str, claimed_by: str) -> bool:
        """`claim_effect` on a synchronous session."""
        with self.db.translate():
            return run(session, claim_plan(self.dialect, job, key, claimed_by))

    def claim_in_sync(self, session: Session, job: str, key: str) -> Claim | None:
        """The committed claim of a key, read in the given synchronous session."""
        with self.db.translate():
            return run(session, claim_in_plan(job, key))

    def finish_sync(self, session: Session, job: str, key: str) -> None:
        """`finish` on a synchronous session: stamp the end, commit work and claim together."""
        with self.db.translate():
            run(session, finish_plan(self.dialect, job, key))
            hooks.before_commit(job, key)
            take_over(session)
            session.commit()

    def abandon_sync(self, session: Session) -> None:
        """Roll a synchronous attempt back (claim included) and close its session."""
        take_over(session)
        with contextlib.suppress(Exception):
            session.rollback()
        with contextlib.suppress(Exception):
            session.close()

    # -- the ledger ---------------------------------------------------------------------

    async def history(self, job: str | None = None, limit: int = 50) -> list[Claim]:
        """Claims, newest first."""
        return [claim_from_row(r) for r in await self.db.read(sql.history(job, limit))]

    async def last_claims(self) -> dict[str, Claim]:
        """The newest claim of each job that has one."""
        return {r.job: claim_from_row(r) for r in await self.db.read(sql.last_claims())}

    async def get_claim(self, job: str, key: str) -> Claim | None:
        """The claim of one slot, if any."""
        rows = await self.db.read(sql.get_claim(job, key))
        return claim_from_row(rows[0]) if rows else None

    async def last_slots(self) -> dict[str, datetime]:
        """The newest claimed slot time of each job that has one (the worker's catch-up floor)."""
        rows = await self.db.read(sql.last_slots())
        return {r.job: r.slot for r in rows if r.slot is not None}

    async def release(self, job: str, key: str) -> Claim | None:
        """Delete one claim so its slot can run again; the claim that was deleted, if any.

        Refused (BadInputError) while an attempt at the slot is running, on both databases:
        its claim is not committed yet, and deleting what is there would change nothing.
        """
        running = BadInputError(
            f"job {job!r} key {key!r} is running right now (or, on SQLite, another write "
            "holds the database): nothing released; try again when it has finished"
        )
        with self.db.translate():
            try:
                async with self.db.engine.connect() as conn:
                    conn = await conn.execution_options(
                        **self.dialect.busy_options(RELEASE_BUSY_MS)
                    )
                    async with conn.begin():
                        if not await self.dialect.try_lock_slot(conn, job, key):
                            raise running
                        row = (await conn.execute(sql.release(job, key))).first()
            except sa.exc.OperationalError as exc:
                if self.dialect.is_busy(exc):
                    raise running from None
                raise
        return claim_from_row(row) if row is not None else None
