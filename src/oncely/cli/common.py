"""What every `oncely` command shares: the context (one event loop per command), the exit
codes, the error handling, and the parsing of its arguments."""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .. import clock
from ..errors import BadInputError, OncelyError, UnknownJobError
from . import render

if TYPE_CHECKING:  # the app (SQLAlchemy, the drivers) is imported when a command needs it
    import asyncio

    from ..app import Oncely

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_UNKNOWN = 0, 1, 2, 3
LEVELS = ("debug", "info", "warning", "error")
T = TypeVar("T")


class Context:
    """What the group's options resolve to, shared by every command.

    Every database call of one command runs on one event loop (`call`), and the pool is
    closed on that loop when the command ends (`close`): a user's AsyncEngine keeps its
    connections bound to the loop that opened them, so a second loop could not reuse them.
    """

    def __init__(self, app_spec: str | None, database_url: str | None) -> None:
        self.app_spec = app_spec
        self.database_url = database_url
        self._app: Oncely | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def app(self) -> Oncely:
        if self._app is None:
            from .loading import load_app

            app = load_app(self.app_spec)
            if self.database_url:
                app.use_database(self.database_url)
            self._app = app
        return self._app

    def call(self, work: Callable[[Oncely], Awaitable[T]]) -> T:
        """Run one async call against the app on the command's event loop."""
        import asyncio

        app = self.app
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)

        async def go() -> T:
            return await work(app)

        return self._loop.run_until_complete(go())

    def close(self) -> None:
        """At the command's end: close oncely's pool on its loop, then the loop (as
        `asyncio.run` does: cancel what is left, finish async generators and executors)."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        import asyncio

        try:
            if self._app is not None:
                loop.run_until_complete(self._app.aclose())
        finally:
            try:
                left = asyncio.all_tasks(loop)
                for task in left:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()


def fail(message: str) -> None:
    """Print an error and exit with the usage/configuration code."""
    render.echo(f"error: {message}", err=True)
    sys.exit(EXIT_USAGE)


def handled(func: Callable[..., None]) -> Callable[..., None]:
    """Turn oncely's errors into one clear line on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            func(*args, **kwargs)
        except OncelyError as exc:
            fail(str(exc))
        except OverflowError as exc:  # a time or number from the command line, out of range
            fail(f"a time or number is out of range: {exc}")

    return wrapper


def text_arg(value: str | None, what: str) -> str | None:
    """A command-line string that the database can store: valid UTF-8 (a shell passes
    undecodable bytes as surrogates), without NUL."""
    if value is None:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInputError(f"{what} {value!r} is not valid UTF-8") from None
    if "\0" in value:
        raise BadInputError(f"{what} {value!r} contains a NUL character")
    return value


if TYPE_CHECKING:  # click >= 8.2 types ParamType by its value; older clicks cannot subscript it
    _FloatParam = click.ParamType[float]
else:
    _FloatParam = click.ParamType


class Finite(_FloatParam):
    """A float in [min, max) that is a real number: nan and inf are refused."""

    name = "seconds"

    def __init__(self, min: float = 0.0, *, open_min: bool = False) -> None:
        self.min, self.open_min = min, open_min

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number) or number > 10**9:
            self.fail(f"{value!r} is not a finite number of seconds (at most 1e9)", param, ctx)
        if number < self.min or (self.open_min and number == self.min):
            bound = ">" if self.open_min else ">="
            self.fail(f"{value!r} must be {bound} {self.min:g}", param, ctx)
        return number


def parse_time(value: str | None, option: str) -> datetime | None:
    """An ISO-8601 time with a UTC offset (`Z` allowed), or None."""
    if value is None:
        return None
    return clock.parse_iso(
        value,
        option,
        hint="use ISO-8601 with a UTC offset, e.g. 2026-11-27T18:00:00-06:00 or"
        " 2026-11-28T00:00:00Z",
        naive="it has no UTC offset; add one, e.g. 2026-11-27T18:00:00-06:00 or …Z",
    )


def known_job(app: Oncely, name: str) -> None:
    """UnknownJobError for a name that is no job; a task's name says to use `enqueue`."""
    if app.tasks.find(name) is not None and all(j.name != name for j in app.registry):
        raise BadInputError(
            f"{name!r} is a task, not a scheduled job: queue a run with "
            f"`oncely enqueue {name} --json '{{...}}'` (a worker runs it)"
        )
    app.registry.job(name)


def known_name(obj: Context, name: str) -> str:
    """The name the slots of `name` are claimed under: a code job's name, or the ledger name
    (`schedule:<name>`) of a schedule kept as data, named bare or so; else as `known_job`
    (UnknownJobError, exit 2). A name that is no code job is looked up in the database."""
    app = obj.app
    if any(j.name == name for j in app.registry):
        return name
    if app.tasks.find(name) is None:
        try:
            resolved = obj.call(lambda a: a.resolve(name))
        except OncelyError:  # no schedules table, unreachable: the name is not known here
            resolved = name
        if resolved != name or name.startswith("schedule:"):
            with contextlib.suppress(UnknownJobError):
                app.registry.job(resolved)
                return resolved
            if resolved in app.data_jobs:
                return resolved
    known_job(app, name)
    return name
