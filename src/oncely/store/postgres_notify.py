"""Postgres's notifications: LISTEN/NOTIFY for new tasks (idle workers wake up) and for
cancel requests (the process running the attempt wakes up), each with its probe."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

TASKS_CHANNEL = "oncely_tasks"
"""The LISTEN/NOTIFY channel that wakes idle workers when tasks are enqueued."""

NOTIFY_SETTING = "oncely.notify"
"""The server setting that turns enqueue notifications off (`off`), for a database, a role
or a connection: an enqueueing commit then takes no notification lock, workers poll."""

TASKS_NOTIFY = sa.text(
    "SELECT pg_notify('oncely_tasks', '')"
    " WHERE current_setting('oncely.notify', true) IS DISTINCT FROM 'off'"
)
"""A notification of tasks available, sent by hand (tasks handed back, retried by an
operator): no payload, so the idle workers take turns by the sender's process id. Nothing
where `oncely.notify` is off."""

# One notification per INSERT statement, sent by the enqueueing transaction itself: it is
# delivered iff that transaction commits, whichever client enqueued (oncely, psql, a trigger).
TASKS_NOTIFY_DDL = (
    f"""
    CREATE OR REPLACE FUNCTION oncely_tasks_notify() RETURNS trigger AS $$
    BEGIN
        PERFORM pg_notify('{TASKS_CHANNEL}', '');
        RETURN NULL;
    END;
    $$ LANGUAGE plpgsql
    """,
    "DROP TRIGGER IF EXISTS oncely_tasks_notify ON oncely_tasks",
    """
    CREATE TRIGGER oncely_tasks_notify AFTER INSERT ON oncely_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION oncely_tasks_notify()
    """,
)


# Schema 12: the trigger's notification names the enqueueing transaction (its id, the same
# for every INSERT of it, so one transaction still sends one notification): what the idle
# workers take turns by (see TaskWorker.notify).
TASKS_NOTIFY_TXID_DDL = (
    f"""
    CREATE OR REPLACE FUNCTION oncely_tasks_notify() RETURNS trigger AS $$
    BEGIN
        PERFORM pg_notify('{TASKS_CHANNEL}', txid_current()::text);
        RETURN NULL;
    END;
    $$ LANGUAGE plpgsql
    """,
)


# Schema 18: the trigger sends nothing where `oncely.notify` is `off` (unset: it sends, one
# notification per transaction, as before). A commit that notified nothing skips Postgres's
# instance-wide notification lock; the workers, reading the same setting, poll.
TASKS_NOTIFY_SETTING_DDL = (
    f"""
    CREATE OR REPLACE FUNCTION oncely_tasks_notify() RETURNS trigger AS $$
    BEGIN
        IF current_setting('{NOTIFY_SETTING}', true) IS DISTINCT FROM 'off' THEN
            PERFORM pg_notify('{TASKS_CHANNEL}', txid_current()::text);
        END IF;
        RETURN NULL;
    END;
    $$ LANGUAGE plpgsql
    """,
)

NOTIFY_OFF = sa.text(f"SELECT current_setting('{NOTIFY_SETTING}', true) = 'off'")
"""Whether enqueue notifications are off for this connection (the setting, if any, of its
database, role or own)."""


PROBE_TIMEOUT_S = 2.0
"""How long a new listener waits for its own probe notification before it concludes that
notifications do not reach it (e.g. behind PgBouncer in transaction pooling)."""
_PROBE = "probe:"
"""The start of a probe notification's payload (a task's notification carries the id of the
transaction that enqueued it, or nothing when sent by hand)."""


@contextlib.asynccontextmanager
async def _listen_on(
    engine: AsyncEngine,
    channel: str,
    callback: Callable[..., None],
    what: str | None,
    *,
    probe: bool = False,
    on_lost: Callable[[], None] | None = None,
    prober: AsyncEngine | None = None,
    on_refused: Callable[[BaseException], None] | None = None,
) -> AsyncIterator[bool]:
    """LISTEN on `channel` on a connection of its own; yield False if that is not possible
    (logged as a warning naming `what` listens, if given: the caller polls instead; a
    connection refused goes to `on_refused` instead, if given: an outage it says itself). With
    `probe`, True only once a notification sent from another connection (of `prober`, default
    `engine`: a worker sends it on its control connection, opening no third one) came
    back (`callback` must hand a probe's payload to `_Probe.seen`). `on_lost()` is called
    if the connection ends while the context is open."""
    log = logging.getLogger("oncely")
    try:
        conn = await engine.connect()
    except Exception as exc:  # the caller still polls; its own connections report errors
        if on_refused is not None:
            on_refused(exc)
        elif what:
            log.warning("cannot LISTEN for %s (%s); polling", what, exc)
        yield False
        return
    driver: Any = None
    lost = _Lost(on_lost)
    try:
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        await driver.add_listener(channel, callback)
        driver.add_termination_listener(lost)
    except Exception as exc:
        if what:
            log.warning("cannot LISTEN for %s (%s); polling", what, exc)
        driver = None
    works = driver is not None
    if works and probe:
        works = await _probed(prober or engine, channel, callback)
        if not works and what:
            log.warning(
                "LISTEN for %s works, but no notification arrives (a pooler in transaction"
                " mode?); polling",
                what,
            )
    try:
        yield works
    finally:
        lost.callback = None  # our own close is no loss
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.remove_termination_listener(lost)
                await driver.remove_listener(channel, callback)
        with contextlib.suppress(Exception):
            await conn.close()


class _Lost:
    """A listening connection's termination listener: calls back once, unless disarmed."""

    def __init__(self, callback: Callable[[], None] | None) -> None:
        self.callback = callback

    def __call__(self, _conn: Any) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


class _Probe:
    """The probes in flight in this process, by payload."""

    waiting: ClassVar[dict[str, asyncio.Event]] = {}

    @classmethod
    def seen(cls, payload: str) -> None:
        event = cls.waiting.get(payload)
        if event is not None:
            event.set()


async def _probed(engine: AsyncEngine, channel: str, callback: Callable[..., None]) -> bool:
    """Whether a notification sent on `channel` from another connection reaches the
    listener within PROBE_TIMEOUT_S."""
    payload = f"{_PROBE}{uuid.uuid4().hex}"
    arrived = _Probe.waiting[payload] = asyncio.Event()
    try:
        async with engine.connect() as other:
            await other.execute(
                sa.text("SELECT pg_notify(:channel, :payload)"),
                {"channel": channel, "payload": payload},
            )
            await other.commit()
        await asyncio.wait_for(arrived.wait(), PROBE_TIMEOUT_S)
    except Exception:  # no answer in time, or the probe could not be sent
        return False
    finally:
        del _Probe.waiting[payload]
    return True


@contextlib.asynccontextmanager
async def listen_tasks(
    engine: AsyncEngine,
    on_notify: Callable[[str], None],
    on_lost: Callable[[], None] | None,
    prober: AsyncEngine | None = None,
    on_refused: Callable[[BaseException], None] | None = None,
) -> AsyncIterator[bool]:
    """LISTEN for new tasks, checked with a probe (sent from a connection of `prober`);
    yield False (poll only) if that is not possible, or if enqueue notifications are off
    (`oncely.notify`, read again at each try); `on_refused(error)` if its connection could
    not be opened."""

    def callback(_conn: Any, pid: Any, _channel: Any, payload: Any) -> None:
        if isinstance(payload, str) and payload.startswith(_PROBE):
            _Probe.seen(payload)  # a listener's check, ours or another worker's
        else:  # the enqueueing transaction's id (schema 12), else the sender's process
            on_notify(payload if isinstance(payload, str) and payload else f"pid {pid}")

    if await _notify_off(prober or engine):
        logging.getLogger("oncely").info(
            "enqueue notifications are off (%s = off); polling", NOTIFY_SETTING
        )
        yield False
        return
    listen = _listen_on(
        engine,
        TASKS_CHANNEL,
        callback,
        "new tasks",
        probe=True,
        on_lost=on_lost,
        prober=prober,
        on_refused=on_refused,
    )
    async with listen as works:
        yield works


async def _notify_off(engine: AsyncEngine) -> bool:
    """Whether `oncely.notify` is `off` on a connection of `engine` (False if it cannot be
    read: the listener's own try reports that)."""
    try:
        async with engine.connect() as conn:
            return bool((await conn.execute(NOTIFY_OFF)).scalar())
    except Exception:
        return False


CANCEL_CHANNEL = "oncely_cancel"
"""The channel a cancel request wakes the process running the attempt on (payload: its id)."""


def listen_cancels(
    engine: AsyncEngine, on_notify: Callable[[int], None]
) -> contextlib.AbstractAsyncContextManager[bool]:
    """LISTEN for cancel requests on a connection of its own; yield False if not possible."""

    def callback(_conn: Any, _pid: Any, _channel: Any, payload: Any) -> None:
        with contextlib.suppress(ValueError):
            on_notify(int(payload))

    return _listen_on(engine, CANCEL_CHANNEL, callback, None)  # the runner still polls
