"""Structured log events: a stable name and fields, on the `oncely` logger.

Each record carries `event` (e.g. `run.skipped`) and `fields` (job, key, slot, replica,
duration …) as attributes, so a JSON formatter can emit them as they are; the plain message
reads `event: text job=… key=…`. Observers (the metrics module) subscribe to the same events,
so a counter and a log line can never disagree.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

logger = logging.getLogger("oncely")

Observer = Callable[[str, Mapping[str, Any]], None]
_observers: list[Observer] = []
_wanted: dict[Observer, frozenset[str] | None] = {}
"""Each observer's events (None: all of them)."""


def subscribe(observer: Observer, names: Collection[str] | None = None) -> None:
    """Call `observer(event, fields)` for every event from now on, or only for the events
    in `names` (idempotent: a second call replaces the first's `names`)."""
    _wanted[observer] = None if names is None else frozenset(names)
    if observer not in _observers:
        _observers.append(observer)


def unsubscribe(observer: Observer) -> None:
    """Stop calling `observer`."""
    if observer in _observers:
        _observers.remove(observer)
    _wanted.pop(observer, None)


ROUTINE = frozenset({"run.skipped", "run.busy", "run.paused"})
"""Events a worker replica reports for every slot another replica won: DEBUG inside
`routine()` (a 5-second job on 3 replicas would log ~100k of them a day at INFO). The same
events from `oncely run` / `app.run()` (a duplicate trigger) stay INFO."""

_routine: contextvars.ContextVar[bool] = contextvars.ContextVar("oncely_routine", default=False)
_levels: dict[str, int] = {}


@contextlib.contextmanager
def routine() -> Iterator[None]:
    """Within the block, ROUTINE events log at DEBUG unless `set_level` says otherwise."""
    token = _routine.set(True)
    try:
        yield
    finally:
        _routine.reset(token)


def set_level(event: str, level: int | str | None) -> None:
    """Log `event` at `level` (e.g. "info") wherever it comes from; None: back to its default.

    Observers (metrics) see every event whatever its level.
    """
    if level is None:
        _levels.pop(event, None)
        return
    numeric = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r} for event {event!r}")
    _levels[event] = numeric


def level_of(event: str, default: int = logging.INFO) -> int:
    """The level `event` logs at: `set_level`'s, else DEBUG when routine, else `default`."""
    if event in _levels:
        return _levels[event]
    if event in ROUTINE and _routine.get():
        return logging.DEBUG
    return default


def emit(event: str, text: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with its fields (a field that is None is left out) and tell observers.

    When no observer wants the event and the logger would drop it, nothing more is done:
    a worker's per-task events cost a level check when nobody listens."""
    observers = [o for o in _observers if (names := _wanted.get(o)) is None or event in names]
    level = level_of(event, level)
    logged = logger.isEnabledFor(level)
    if not observers and not logged:
        return
    present = {k: v for k, v in fields.items() if v is not None}
    for observer in observers:
        observer(event, present)
    if logged:
        tail = " ".join(f"{k}={v}" for k, v in present.items())
        logger.log(level, "%s: %s %s", event, text, tail, extra={"event": event, "fields": present})
