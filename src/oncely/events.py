"""Structured log events: a stable name and fields, on the `oncely` logger.

Each record carries `event` (e.g. `run.skipped`) and `fields` (job, key, slot, replica,
duration …) as attributes, so a JSON formatter can emit them as they are; the plain message
reads `event: text job=… key=…`. Observers (the metrics module) subscribe to the same events,
so a counter and a log line can never disagree.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger("oncely")

Observer = Callable[[str, Mapping[str, Any]], None]
_observers: list[Observer] = []


def subscribe(observer: Observer) -> None:
    """Call `observer(event, fields)` for every event from now on (idempotent)."""
    if observer not in _observers:
        _observers.append(observer)


def unsubscribe(observer: Observer) -> None:
    """Stop calling `observer`."""
    if observer in _observers:
        _observers.remove(observer)


def emit(event: str, text: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with its fields (a field that is None is left out) and tell observers."""
    present = {k: v for k, v in fields.items() if v is not None}
    for observer in list(_observers):
        observer(event, present)
    if logger.isEnabledFor(level):
        tail = " ".join(f"{k}={v}" for k, v in present.items())
        logger.log(level, "%s: %s %s", event, text, tail, extra={"event": event, "fields": present})
