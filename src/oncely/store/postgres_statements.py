"""Postgres's own statements, and the fast paths' texts for the driver (asyncpg), each rendered
from the one definition of its statement: the slot's lock and claim, an attempt's and a task's
transaction on the driver, the ack with its COMMIT, the enqueue of one task or many."""

from __future__ import annotations

import functools
import json
import re
import weakref
from datetime import datetime
from types import SimpleNamespace
from typing import Any, NamedTuple, NoReturn

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from ..errors import BadInputError, DatabaseError, SchemaMissingError
from . import sql, task_queue_sql
from .dialect import (
    MISSING_TABLES,
    ClaimAnswer,
    marks_verdict,
)
from .tables import MARKED, UTCDateTime, attempts

_ASYNCPG = PGDialect_asyncpg()  # type: ignore[no-untyped-call]
"""The dialect the driver's texts are rendered with (compiled once, at import or first use)."""


class OnDriver(NamedTuple):
    """A statement as asyncpg takes it, rendered once from its one definition (SQLAlchemy):
    its text with positional parameters, their names in order, and the values the statement
    holds itself (its constants, a NULL)."""

    text: str
    names: tuple[str, ...]
    held: dict[str, Any]

    def args(self, values: dict[str, Any]) -> list[Any]:
        """The positional arguments for these named values (a name not given: the value the
        statement holds, None for a parameter)."""
        return [values.get(name, self.held.get(name)) for name in self.names]


def on_driver(stmt: Any) -> OnDriver:
    """`stmt` rendered for asyncpg (see OnDriver)."""
    compiled = stmt.compile(dialect=_ASYNCPG)
    held = {k: v for k, v in compiled.construct_params(_check=False).items()}
    return OnDriver(compiled.string, tuple(compiled.positiontup or ()), held)


def simple_query(stmt: Any, params: dict[str, str]) -> str:
    """`stmt` as text with no parameters (what a simple query, the only kind that carries a
    COMMIT with it, takes): each named in `params` written as its text there, each value the
    statement holds written as a literal (a NULL, a number, a string)."""
    rendered = on_driver(stmt)

    def literal(match: re.Match[str]) -> str:
        name = rendered.names[int(match.group(1)) - 1]
        if name in params:
            return params[name]
        value = rendered.held.get(name)
        if value is None:
            return "NULL"
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return "'" + str(value).replace("'", "''") + "'"

    return re.sub(r"\$(\d+)", literal, rendered.text)


# Lock and claim in one round trip: each lock CTE runs once (volatile, referenced twice);
# the job lock is only tried for an exclusive attempt; the insert runs only if the locks
# were ours; the row says which case we are in.
_LOCK_AND_CLAIM = """
    WITH lock AS (
        SELECT pg_try_advisory_xact_lock(:slot_hi, :slot_lo) AS got
    ), job_lock AS (
        SELECT CASE WHEN CAST(:exclusive AS boolean)
                    THEN pg_try_advisory_xact_lock(:job_hi, :job_lo)
                    ELSE true END AS got
    ), ins AS (
        INSERT INTO oncely_runs (job, key, scheduled_for, claimed_at, claimed_by)
        SELECT CAST(:job AS varchar), CAST(:key AS varchar),
               CAST(:scheduled_for AS timestamptz), now(), CAST(:claimed_by AS varchar)
        FROM lock, job_lock WHERE lock.got AND job_lock.got
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT (SELECT got FROM lock) AS got, (SELECT got FROM job_lock) AS job_free,
           (SELECT count(*) FROM ins) AS claimed"""
LOCK_AND_CLAIM = sa.text(_LOCK_AND_CLAIM + "\n    ").bindparams(
    sa.bindparam("scheduled_for", type_=UTCDateTime())
)

# -- attempts on the driver ---------------------------------------------------------------
# On asyncpg an attempt's own statements go straight to the driver, and the job's go through
# an AsyncSession on the same connection in SQLAlchemy's AUTOCOMMIT mode, so SQLAlchemy sends
# no BEGIN, COMMIT or ROLLBACK of its own: all of them run inside the one transaction that
# `begin_attempt` opens and `commit_attempt` / `rollback_attempt` end. Three round trips for
# an attempt (BEGIN; lock-and-claim; finish-and-COMMIT) and no SQLAlchemy statement machinery
# on oncely's side; the job's session is a plain AsyncSession.

# LOCK_AND_CLAIM, for the driver (rendered from its text, with positional parameters in the
# same order); it also names the claimed slot in two transaction-local
# settings, so the finish below is a constant string that can travel with the COMMIT, and
# (with :check_pause) reads whether a pause of the job holds the slot's time
# (`sql.pause_covering`): `app.run` then sends no statement of its own for it. The same
# snapshot as a read after the lock would have, but for the transactions that commit in
# between: a pause has no lock to order it with an attempt (docs/design/fate.md: a pause whose
# commit lands late).
DRIVER_LOCK_AND_CLAIM_STATEMENT = on_driver(
    sa.text(
        _LOCK_AND_CLAIM  # noqa: S608 - oncely's own text: every value is a bound parameter
        + """,
           CASE WHEN (SELECT count(*) FROM ins) > 0 THEN txid_current() END AS xid,
           set_config('oncely.job', CAST(:job AS varchar), true) AS claimed_job,
           set_config('oncely.key', CAST(:key AS varchar), true) AS claimed_key,
           CASE WHEN CAST(:check_pause AS boolean) THEN EXISTS (
               SELECT 1 FROM oncely_pauses WHERE job = CAST(:job AS varchar)
               AND paused_at <= CAST(:scheduled_for AS timestamptz)
               AND (resumed_at IS NULL OR resumed_at > CAST(:scheduled_for AS timestamptz))
           ) END AS paused
"""
    )
)
DRIVER_LOCK_AND_CLAIM = DRIVER_LOCK_AND_CLAIM_STATEMENT.text

_JOB: Any = sa.bindparam("job")
_KEY: Any = sa.bindparam("key")
_CLAIMED = {"job": "current_setting('oncely.job')", "key": "current_setting('oncely.key')"}
"""The slot claimed above, as the texts that read it from its two settings."""

# The end of a slot's run on its claim (sql.finish_bound, as `Dialect.finish_statement` builds
# it), for the driver.
_FINISH = sql.finish_bound(sa.func.clock_timestamp())
DRIVER_FINISH_STATEMENT = on_driver(_FINISH)
DRIVER_FINISH = DRIVER_FINISH_STATEMENT.text
# The same for the slot claimed above, and the commit, in one message (one round trip). A
# failing UPDATE (an aborted transaction) stops the message before its COMMIT.
DRIVER_FINISH_AND_COMMIT = (
    simple_query(_FINISH, {"claim_job": _CLAIMED["job"], "claim_key": _CLAIMED["key"]}) + "; COMMIT"
)


# Once the slot is locked and claimed (the statement above): refuse it if an attempt gave it
# up or its retry is not due (a division by zero stops the message before the SAVEPOINT), else
# take the savepoint a failed attempt rolls back to. A statement of its own, after the lock's:
# its snapshot sees the fate that the lock's previous holder committed as it let go. The
# driver's own (elsewhere `dialect.checked_plan` reads `sql.slot_marks` and decides in
# Python, which takes a round trip more): built here from the same marks (`tables.MARKED`).
def _refused(waiting: bool) -> Any:
    """A division by zero if an attempt gave the slot up (or, with `waiting`, if its retry
    is not due yet)."""
    refuses: Any = attempts.c.final
    if waiting:
        refuses = sa.or_(attempts.c.final, attempts.c.retry_at > sa.func.clock_timestamp())
    refusing = (
        sa.select(sa.literal_column("1"))
        .where(attempts.c.job == _JOB, attempts.c.key == _KEY, MARKED, refuses)
        .limit(1)
        .subquery("refused")
    )
    return sa.select(
        sa.literal_column("1").op("/")((sa.literal_column("1") - sa.func.count()).self_group())
    ).select_from(refusing)


DRIVER_CHECK_AND_SAVEPOINT = (
    simple_query(task_queue_sql.with_constants_inline(_refused(True)), _CLAIMED)
    + "; SAVEPOINT oncely_attempt"
)
# The same for the caller's retry (`oncely run`): a slot waiting for its retry runs now.
DRIVER_CHECK_FINAL_AND_SAVEPOINT = (
    simple_query(task_queue_sql.with_constants_inline(_refused(False)), _CLAIMED)
    + "; SAVEPOINT oncely_attempt"
)
# Why the check above refused a slot (read after the rollback, the rare path): the slot's
# marks (sql.slot_marks), for the driver.
DRIVER_MARKS_STATEMENT = on_driver(
    task_queue_sql.with_constants_inline(sql.slot_marks(_JOB, _KEY, sa.func.clock_timestamp()))
)
DRIVER_MARKS = DRIVER_MARKS_STATEMENT.text
# Whether the slot was claimed before, when another slot of its job holds the job's lock
# (sql.has_claim), for the driver.
DRIVER_HAS_CLAIM_STATEMENT = on_driver(sql.has_claim(_JOB, _KEY))
DRIVER_HAS_CLAIM = DRIVER_HAS_CLAIM_STATEMENT.text


# The bare claim on a caller's asyncpg connection (see `claim_on_driver`): the claim's one
# statement (sql.claim_bound, as `PostgresDialect.claim_statement` builds it), for the driver.
DRIVER_CLAIM_STATEMENT = on_driver(
    task_queue_sql.with_constants_inline(
        sql.claim_bound(postgresql.insert, sa.func.clock_timestamp())
    )
)
DRIVER_CLAIM = DRIVER_CLAIM_STATEMENT.text


async def claim_on_driver(conn: Any, job: str, key: str, claimed_by: str) -> bool:
    """`claim_run` on an asyncpg connection: the same INSERT, with no SQLAlchemy in between.

    The connection must be inside the caller's transaction: outside one the claim would
    commit at once, apart from the work it guards, so that is refused and nothing is sent.
    """
    if not conn.is_in_transaction():
        raise BadInputError(
            f"claim_run({job!r}, {key!r}) needs the caller's open transaction: on an asyncpg "
            "connection, call it inside `async with conn.transaction():` so the claim "
            "commits with your work or not at all"
        )
    try:
        values = {"job": job, "key": key, "claimed_by": claimed_by}
        return await conn.fetchval(DRIVER_CLAIM, *DRIVER_CLAIM_STATEMENT.args(values)) is not None
    except asyncpg.UndefinedTableError as exc:
        raise SchemaMissingError(MISSING_TABLES) from exc
    except asyncpg.PostgresError as exc:
        raise DatabaseError(f"claiming failed: {exc}") from exc


# -- a task's own transaction, on the driver ---------------------------------------------
# A task's session runs in SQLAlchemy's AUTOCOMMIT mode on the worker's pool, as an attempt's
# does: its first statement checks a connection out, and `begin_task` then opens the task's
# transaction on the driver, durable although the pool's connections are not (a lease or a
# heartbeat does not wait for the disk). The ack and the COMMIT travel in one message: a lost
# lease makes the ack's count zero, the division fails, and the message stops before COMMIT.

TASK_BEGIN = "BEGIN; SET LOCAL synchronous_commit TO on"
_ACK_ONE = task_queue_sql.ack_one(sa.func.clock_timestamp())
TASK_ACK = (  # the id and token go in by `task_ack_sql`, validated
    "WITH acked AS ("  # noqa: S608 - rendered from the ack's statement, no value in it
    + simple_query(
        _ACK_ONE.returning(sa.literal_column("1")), {"p_id": "{id:d}", "p_token": "'{token}'"}
    )
    + ") SELECT 1 / count(*) FROM acked"
)
TASK_ACK_AND_COMMIT = TASK_ACK + "; COMMIT"
# Schema 13: the same ack as a function, so that the server plans its UPDATE once per
# connection (plpgsql keeps the plan) instead of at every task: the UPDATE's planning, with the
# table's ten partial indexes to weigh, cost more server CPU than its run (on one connection,
# 0.175-0.23 ms of the backend's CPU per ack transaction as text against 0.075-0.115 ms through
# the function; docs/scale.md). A lost lease raises no_data_found (P0002).
TASK_ACK_FUNCTION_DDL = (
    """
    CREATE OR REPLACE FUNCTION oncely_task_ack(p_id bigint, p_token varchar) RETURNS void AS $$
    BEGIN
        """
    + simple_query(_ACK_ONE, {"p_id": "p_id", "p_token": "p_token"})
    + """;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the task''s lease was lost' USING ERRCODE = 'no_data_found';
        END IF;
    END;
    $$ LANGUAGE plpgsql
    """,
)
TASK_ACK_CALL = "SELECT oncely_task_ack({id:d}, '{token}')"
TASK_ACK_CALL_AND_COMMIT = TASK_ACK_CALL + "; COMMIT"
# The values above are written into the message, not bound: a simple query (the only kind
# that carries a COMMIT with it) takes no parameters. Both are oncely's own: the task's id (an
# int) and the worker's lease token, which must match this pattern (see TaskWorker.token).
_TOKEN = re.compile(r"[0-9a-f]{1,32}\.[0-9]{1,20}")


def task_ack_sql(task_id: int, token: str, *, function: bool = False, then: str = "COMMIT") -> str:
    """The ack of one task as a simple query, followed by `then` (its COMMIT, or in a group
    the release of the task's savepoint and the next one's)."""
    if not isinstance(task_id, int) or not _TOKEN.fullmatch(token):
        raise BadInputError(f"not a task id and lease token: {task_id!r}, {token!r}")
    sql = TASK_ACK_CALL if function else TASK_ACK
    return f"{sql.format(id=task_id, token=token)}; {then}"


# -- a group of tasks in one transaction, a savepoint each ----------------------------------
# With `WorkerOptions.group`, a worker with a backlog runs up to that many async tasks one
# after another on one connection, in one durable transaction, each inside the savepoint
# below (docs/design/task-execution.md, "Groups of tasks with a savepoint each"). A savepoint
# is always open while a task runs: taken with the group's BEGIN, and after each task's ack or
# failure released and taken again in the same message. A task that raises or lost its lease
# rolls back to it (ROLLBACK TO keeps the savepoint, for the next task).

GROUP_SAVEPOINT = "SAVEPOINT oncely_task"
GROUP_BEGIN = f"{TASK_BEGIN}; {GROUP_SAVEPOINT}"
GROUP_NEXT = f"RELEASE SAVEPOINT oncely_task; {GROUP_SAVEPOINT}"
GROUP_UNDO = "ROLLBACK TO SAVEPOINT oncely_task"


# -- a caller's AsyncSession on asyncpg -------------------------------------------------------
# `claim_run` and `enqueue` on a user's AsyncSession send their statement on the session's own
# asyncpg connection, as on a bare one: the prepared statement, with no SQLAlchemy statement
# machinery (compilation, cursor, result) in between, which costs more CPU than the round trip.
# The statement must run inside the session's transaction. SQLAlchemy sends its BEGIN lazily,
# with the session's first statement; for a session that has not sent one yet, the BEGIN is
# sent here the way SQLAlchemy's adapter sends it (so that its COMMIT and ROLLBACK end this
# very transaction). The session's pending objects are flushed first if its autoflush is on,
# as `session.execute` of the same INSERT would: the order of the writes, and where a flush
# error is raised, do not depend on the driver.


async def session_driver(session: AsyncSession, conn: AsyncConnection | None = None) -> Any:
    """The asyncpg connection of the session's connection (`conn` if the caller has it), in
    the session's transaction (begun here if SQLAlchemy has not sent its BEGIN yet), or
    outside any if the session runs in autocommit mode; None if SQLAlchemy's adapter cannot
    be driven that way."""
    sync = session.sync_session
    if sync.autoflush and (sync.new or sync.deleted or sync.identity_map.check_modified()):
        await session.flush()
    if conn is None:
        conn = await session.connection()
    adapted = conn.sync_connection.connection.dbapi_connection  # type: ignore[union-attr]
    driver = getattr(adapted, "driver_connection", None)
    if not isinstance(driver, asyncpg.Connection):
        return None
    if driver.is_in_transaction() or getattr(adapted, "autocommit", False):
        return driver
    begin = getattr(adapted, "_start_transaction", None)  # what the adapter's cursor awaits
    if begin is None:
        return None
    try:
        await begin()
    except Exception as exc:  # the adapter's own error class, from the driver's
        raise DatabaseError(f"beginning the transaction failed: {exc.__cause__ or exc}") from exc
    return driver if driver.is_in_transaction() else None


_ON_DRIVER: weakref.WeakKeyDictionary[Any, tuple[str, list[str], dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)
"""Statements expanded for the driver, for as long as their statement lives."""


def expanded_on_driver(
    stmt: Any, dialect: sa.Dialect, params: dict[str, Any]
) -> tuple[str, list[str], dict[str, Any]]:
    """`stmt` as asyncpg takes it: its text with positional parameters (each element of a
    list the statement holds, such as a worker's task names, one of them), their names in
    order, and the values the statement holds (the caller's `p_*` come with each call)."""
    found = _ON_DRIVER.get(stmt)
    if found is None:
        # The values the statement holds are plain (its task names and queues, a NULL): no
        # type of theirs processes a bound value on Postgres, nor do the rows need one
        # (timestamptz comes back as aware UTC datetimes, as UTCDateTime returns them).
        expanded = stmt.compile(dialect=dialect).construct_expanded_state(params)
        fixed = {k: v for k, v in expanded.parameters.items() if k not in params}
        found = _ON_DRIVER[stmt] = (expanded.statement, list(expanded.positiontup or ()), fixed)
    return found


def driver_of(conn: AsyncConnection) -> Any:
    """The asyncpg connection under a checked-out connection, at hand without I/O
    (get_raw_connection() would take a greenlet round of its own to answer the same)."""
    return conn.sync_connection.connection.driver_connection  # type: ignore[union-attr]


async def checked_on_driver(
    driver: Any, job: str, key: str, retry_now: bool = False
) -> ClaimAnswer:
    """The claimed slot's check and savepoint (DRIVER_CHECK_AND_SAVEPOINT, or with
    `retry_now` DRIVER_CHECK_FINAL_AND_SAVEPOINT); refused, the transaction is rolled back and
    the slot's marks say why (BUSY if they no longer refuse: a retry came due meanwhile, the
    worker tries again soon)."""
    try:
        await driver.execute(
            DRIVER_CHECK_FINAL_AND_SAVEPOINT if retry_now else DRIVER_CHECK_AND_SAVEPOINT
        )
    except asyncpg.DivisionByZeroError:
        await driver.execute("ROLLBACK")
        values = {"job": job, "key": key}
        row = await driver.fetchrow(DRIVER_MARKS, *DRIVER_MARKS_STATEMENT.args(values))
        return marks_verdict(SimpleNamespace(**dict(row)), retry_now) or ClaimAnswer.BUSY
    return ClaimAnswer.CLAIMED


SLOT_HELD = sa.text(
    "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2"
    " AND classid::bigint = :hi AND objid::bigint = :lo AND database = ("
    "SELECT oid FROM pg_database WHERE datname = current_database())"
)
"""Whether some session holds a slot's (or a job's) advisory lock (read from pg_locks, not
taken)."""

XACT_ID = sa.text("SELECT txid_current()")
"""The open transaction's id: what a lost COMMIT's fate is asked by (see XACT_STATUS)."""
XACT_STATUS = sa.text("SELECT txid_status(:xid)")
"""What became of a transaction by its id: committed, aborted, in progress (NULL: too old
to tell)."""

# Enqueue any number of tasks in one round trip: the arguments as one JSON array, the other
# columns as arrays beside it (NULL when the same for all: the task, queue and trace context
# then come as one value; keys, times and delays as none), in input order (ids follow it); existing
# (task, idempotency_key) pairs skipped. One JSON document and few arrays keep the encoding
# of a thousand tasks to a few microseconds each on both sides.
_ENQUEUE_MANY = """
    INSERT INTO oncely_tasks
        (task, queue, args, state, attempt, run_at, created_at, idempotency_key,
         priority, concurrency_key, concurrency, rate_key, rate, rate_period, trace_context)
    SELECT coalesce(u.task, {task}), coalesce(u.queue, {queue}), u.args, 'available', 0,
           coalesce(u.run_at, clock_timestamp() + make_interval(secs => coalesce(u.delay, 0))),
           clock_timestamp(), u.key, coalesce(u.priority, 0), u.ckey, u.conc, u.rkey, u.rate,
           u.period, coalesce(u.trace, {trace})
    FROM ROWS FROM (jsonb_array_elements({args}), unnest({tasks}), unnest({queues}),
                    unnest({keys}), unnest({run_ats}), unnest({delays}), unnest({priorities}),
                    unnest({ckeys}), unnest({concs}), unnest({rkeys}), unnest({rates}),
                    unnest({periods}), unnest({traces}))
         WITH ORDINALITY AS u(args, task, queue, key, run_at, delay, priority, ckey, conc, rkey,
                              rate, period, trace, ord)
    ORDER BY u.ord
    ON CONFLICT (task, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, task, idempotency_key, run_at, created_at
"""
_ENQUEUE_TYPES = {
    "args": "jsonb",
    "task": "varchar",
    "queue": "varchar",
    "tasks": "varchar[]",
    "queues": "varchar[]",
    "keys": "varchar[]",
    "run_ats": "timestamptz[]",
    "delays": "float8[]",
    "priorities": "int4[]",
    "ckeys": "varchar[]",
    "concs": "int4[]",
    "rkeys": "varchar[]",
    "rates": "int4[]",
    "periods": "float8[]",
    "trace": "text",
    "traces": "text[]",
}
_ENQUEUE_ORDER = tuple(_ENQUEUE_TYPES)
_ENQUEUE_LIMITS = {
    "priorities": "p_priority",
    "ckeys": "p_ckey",
    "concs": "p_conc",
    "rkeys": "p_rkey",
    "rates": "p_rate",
    "periods": "p_period",
}
"""The limit columns' arrays and their parameter in an enqueue's parameter set."""

ENQUEUE = sa.text(
    _ENQUEUE_MANY.format(**{k: f"CAST(:{k} AS {t})" for k, t in _ENQUEUE_TYPES.items()})
).columns(
    id=sa.BigInteger(),
    task=sa.String(),
    idempotency_key=sa.String(),
    run_at=UTCDateTime(),
    created_at=UTCDateTime(),
)

# The same, for an asyncpg connection: positional parameters in _ENQUEUE_ORDER.
DRIVER_ENQUEUE_MANY = _ENQUEUE_MANY.format(
    **{k: f"${_ENQUEUE_ORDER.index(k) + 1}::{t}" for k, t in _ENQUEUE_TYPES.items()}
)


def _same(values: list[Any]) -> bool:
    first = values[0]
    return all(v == first for v in values)


def enqueue_many_params(params: list[dict[str, Any]]) -> dict[str, Any]:
    """ENQUEUE's parameters for these parameter sets (those of `task_queue_sql.enqueue`)."""
    tasks = [p["p_task"] for p in params]
    queues = [p["p_queue"] for p in params]
    keys = [p["p_key"] for p in params]
    run_ats = [p["p_run_at"] for p in params]
    delays = [p["p_delay"] for p in params]
    traces = [p.get("p_trace") for p in params]
    one_task, one_queue, one_trace = _same(tasks), _same(queues), _same(traces)
    return {
        "args": json.dumps([p["p_args"] for p in params]),
        "task": tasks[0] if one_task else None,
        "queue": queues[0] if one_queue else None,
        "tasks": None if one_task else tasks,
        "queues": None if one_queue else queues,
        "keys": keys if any(k is not None for k in keys) else None,
        "run_ats": run_ats if any(r is not None for r in run_ats) else None,
        "delays": delays if any(delays) else None,
        **{name: _array(params, p) for name, p in _ENQUEUE_LIMITS.items()},
        "trace": traces[0] if one_trace else None,
        "traces": None if one_trace else traces,
    }


def _array(params: list[dict[str, Any]], name: str) -> list[Any] | None:
    """One parameter of every set, or None if it is None in all of them (a priority: 0, its
    default). A limit group's key may be "" (the task's own group): kept."""
    values = [p.get(name) for p in params]
    empty = (None, 0) if name == "p_priority" else (None,)
    return values if any(v not in empty for v in values) else None


# -- enqueue on a caller's asyncpg connection -----------------------------------------------
# The rows ENQUEUE inserts, from one prepared statement on the driver: no SQLAlchemy between an
# application that speaks asyncpg and its INSERT. One task: the enqueue's one statement
# (task_queue_sql.enqueue, as `PostgresDialect.enqueue_statement` builds it) rendered for the
# driver; many: DRIVER_ENQUEUE_MANY.


@functools.cache
def driver_enqueue_one() -> OnDriver:
    """The one-task INSERT on the driver, rendered at its first use."""
    run_at, delay = task_queue_sql.enqueue_times()
    one = task_queue_sql.enqueue(
        postgresql.insert, sa.func.clock_timestamp(), due_at(run_at, delay)
    )
    return on_driver(task_queue_sql.with_constants_inline(one))


# The records of the retained tasks of one task name with these idempotency keys (the
# duplicates), task_queue_sql.by_keys, for the driver: the keys as one array, the arguments
# read as text whatever codec the caller's connection has for jsonb (`driver_rows` decodes).
_BY_KEYS = task_queue_sql.by_keys(
    sa.bindparam("task", type_=sa.String()), sa.bindparam("keys", type_=sa.ARRAY(sa.String()))
)
DRIVER_TASKS_BY_KEYS_STATEMENT = on_driver(
    _BY_KEYS.with_only_columns(
        *(
            sa.cast(column, sa.Text()).label("args") if column.name == "args" else column
            for column in task_queue_sql.RECORD_COLUMNS
        )
    )
)
DRIVER_TASKS_BY_KEYS = DRIVER_TASKS_BY_KEYS_STATEMENT.text


class Enqueued(NamedTuple):
    """What an enqueue on the driver reads back of a new row (RETURNING's columns, in order)."""

    id: int
    task: str
    idempotency_key: str | None
    run_at: datetime
    created_at: datetime


def driver_rows(records: list[Any]) -> list[Any]:
    rows = [SimpleNamespace(**dict(r)) for r in records]
    for row in rows:
        if isinstance(getattr(row, "args", None), str):
            row.args = json.loads(row.args)
    return rows


async def enqueue_on_driver(conn: Any, params: list[dict[str, Any]]) -> list[Any]:
    """Insert tasks (the parameter sets of `task_queue_sql.enqueue`) on an asyncpg connection, in
    its open transaction if it is in one (else the INSERT commits by itself); the new rows."""
    try:
        if len(params) == 1:
            p, one = params[0], driver_enqueue_one()
            values = {**p, "p_args": json.dumps(p["p_args"])}
            record = await conn.fetchrow(one.text, *one.args(values))
            return [Enqueued._make(record)] if record is not None else []
        many = enqueue_many_params(params)
        records = await conn.fetch(DRIVER_ENQUEUE_MANY, *(many[k] for k in _ENQUEUE_ORDER))
        return [Enqueued._make(r) for r in records]
    except asyncpg.PostgresError as exc:
        _raise_enqueue_error(exc)


async def tasks_by_keys_on_driver(conn: Any, task: str, keys: list[str]) -> list[Any]:
    """The retained rows of `task` with these idempotency keys, on an asyncpg connection."""
    try:
        values = {"task": task, "keys": keys}
        by_keys = DRIVER_TASKS_BY_KEYS_STATEMENT.args(values)
        return driver_rows(await conn.fetch(DRIVER_TASKS_BY_KEYS, *by_keys))
    except asyncpg.PostgresError as exc:
        _raise_enqueue_error(exc)


def _raise_enqueue_error(exc: asyncpg.PostgresError) -> NoReturn:
    if isinstance(exc, asyncpg.UndefinedTableError):
        raise SchemaMissingError(MISSING_TABLES) from exc
    raise DatabaseError(f"enqueueing failed: {exc}") from exc


def due_at(run_at: Any, delay: Any) -> Any:
    """When an enqueued task is due: at `run_at`, else `delay` seconds after the database's
    clock (see `Dialect.due_at`)."""
    return sa.func.coalesce(
        run_at, sa.func.clock_timestamp() + sa.func.make_interval(0, 0, 0, 0, 0, 0, delay)
    )
