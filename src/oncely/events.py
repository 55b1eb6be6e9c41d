"""Structured log events: a stable name and fields, on the `oncely` logger.

Each record carries `event` (e.g. `run.skipped`) and `fields` (job, key, slot, replica,
duration …) as attributes, so a JSON formatter can emit them as they are; the plain message
reads `event: text job=… key=…`.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("oncely")


def emit(event: str, text: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with its fields (a field that is None is left out)."""
    present = {k: v for k, v in fields.items() if v is not None}
    if not logger.isEnabledFor(level):
        return
    tail = " ".join(f"{k}={v}" for k, v in present.items())
    logger.log(level, "%s: %s %s", event, text, tail, extra={"event": event, "fields": present})
