"""The only place that reads the wall clock; everything else is handed `now`."""

from __future__ import annotations

from datetime import datetime, timezone


def utcnow() -> datetime:
    """The current instant, timezone-aware, in UTC."""
    return datetime.now(timezone.utc)
