"""What a server that is down, restarting or starting up raises, bare or wrapped by
SQLAlchemy, at a statement or at the connect: an outage (`Store.is_unavailable`, the one
place that says so), which a worker waits out; and the worker's own statements raise it as
oncely's DatabaseUnavailableError, never as the driver's error."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_dbapi
from tests.worker.proxy import Proxy

from oncely import Oncely
from oncely.errors import DatabaseUnavailableError

DBAPI = AsyncAdapt_asyncpg_dbapi(asyncpg)
PG = asyncpg.exceptions

DRIVER_ERRORS: dict[str, Callable[[], BaseException]] = {
    "57P03 starting up": lambda: PG.CannotConnectNowError("the database system is starting up"),
    "57P03 not yet accepting": lambda: PG.CannotConnectNowError(
        "the database system is not yet accepting connections"
    ),
    "57P03 shutting down": lambda: PG.CannotConnectNowError("the database system is shutting down"),
    "57P01 admin shutdown": lambda: PG.AdminShutdownError(
        "terminating connection due to administrator command"
    ),
    "57P02 crash shutdown": lambda: PG.CrashShutdownError(
        "terminating connection because of crash of another server process"
    ),
    "08003 closed mid-operation": lambda: PG.ConnectionDoesNotExistError(
        "connection was closed in the middle of operation"
    ),
    "08006 connection failure": lambda: PG.ConnectionFailureError("connection failure"),
    "connection is closed": lambda: PG.InterfaceError("connection is closed"),
    "refused": lambda: ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)"),
    "reset": lambda: ConnectionResetError(104, "Connection reset by peer"),
}


def wrapped(driver: BaseException) -> list[BaseException]:
    """`driver` as SQLAlchemy hands it on: in its asyncpg adapter's error, in a DBAPIError
    (a connect's), an OperationalError, an InterfaceError."""
    message = str(driver)
    return [
        sa.exc.DBAPIError("SELECT 1", {}, DBAPI.Error(message, driver)),
        sa.exc.OperationalError("SELECT 1", {}, DBAPI.OperationalError(message, driver)),
        sa.exc.InterfaceError("SELECT 1", {}, DBAPI.InterfaceError(message, driver)),
    ]


@pytest.mark.parametrize("name", sorted(DRIVER_ERRORS))
async def test_every_error_of_a_server_down_restarting_or_starting_up_is_an_outage(
    name: str,
) -> None:
    app = Oncely("postgresql://postgres@127.0.0.1:9/nowhere")
    try:
        driver = DRIVER_ERRORS[name]()
        for error in [driver, *wrapped(driver)]:
            assert app.store.is_unavailable(error), f"{name}: {type(error).__name__}"
    finally:
        await app.aclose()


async def test_not_an_outage_is_not_called_one() -> None:
    app = Oncely("postgresql://postgres@127.0.0.1:9/nowhere")
    try:
        for driver in (
            PG.UniqueViolationError("duplicate key value violates unique constraint"),
            PG.QueryCanceledError("canceling statement due to statement timeout"),
            PG.InterfaceError("cannot perform operation: another operation is in progress"),
        ):
            for error in [driver, *wrapped(driver)[:1]]:  # as SQLAlchemy wraps them
                assert not app.store.is_unavailable(error), type(error).__name__
    finally:
        await app.aclose()


async def test_a_workers_lease_and_look_ahead_on_a_server_that_refuses_are_an_outage() -> None:
    """The task leaser's statements open their connection inside the store's translation:
    a server that refuses connections (here: nothing listens) is DatabaseUnavailableError,
    not the driver's error escaping to the worker (which ended it)."""
    proxy = Proxy("127.0.0.1", 9)  # never restored: every connect is refused
    app = Oncely(f"postgresql://postgres:s3cret@127.0.0.1:{proxy.port}/nowhere")
    conns = app.store.worker_connections()
    conns.open(2)
    try:
        with pytest.raises(DatabaseUnavailableError) as leased:
            await conns.lease(None, 1, "token", "by", 5.0, ["a_task"])
        assert "s3cret" not in str(leased.value)
        with pytest.raises(DatabaseUnavailableError):
            await conns.next_due(None, ["a_task"], held=False, since=1.0)
    finally:
        await conns.close()
        await app.aclose()
