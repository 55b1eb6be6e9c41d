"""The only place that reads the wall clock; everything else is handed `now`."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from .errors import BadInputError

_source: Callable[[], datetime] | None = None

FUTURE_SKEW = timedelta(seconds=5)
"""How far past the database's clock `oncely run --now` may name a slot before it is refused
as a future slot: the skew tolerated between the host that computed --now and the database."""


def utcnow() -> datetime:
    """The current instant, timezone-aware, in UTC (or the test clock's, when one is set)."""
    if _source is not None:
        return _source().astimezone(timezone.utc)
    return datetime.now(timezone.utc)


def set_source(source: Callable[[], datetime] | None) -> None:
    """Read time from `source` instead of the wall clock (None: the wall clock again).

    For `oncely.testing`'s frozen clock; applications never need it.
    """
    global _source
    _source = source


def is_set() -> bool:
    """Whether a test clock replaces the wall clock (then it stands in for database time too)."""
    return _source is not None


_ISO_SHAPE = re.compile(
    r"^\d{4}-\d{2}-\d{2}([T ]\d{2}(:\d{2}(:\d{2}(\.\d+)?)?)?)?([+-]\d{2}:\d{2})?$"
)

MIN_YEAR, MAX_YEAR = 1970, 9000
"""The years a time given by a person (an option, a form field) may name."""


def parse_iso(value: str, what: str, *, hint: str, naive: str | None = None) -> datetime:
    """An ISO-8601 time given by a person (`Z` allowed), as `what` (named in errors, with
    `hint`). Without a UTC offset: BadInputError(`naive`), or, with `naive` None, UTC."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        if _ISO_SHAPE.match(text) and ("range" in str(exc) or "must be in" in str(exc)):
            # The shape is right, a field is not: 2026-02-30, 24:00, +25:00.
            raise BadInputError(f"bad {what} {value!r}: no such date or time ({exc})") from None
        raise BadInputError(f"bad {what} {value!r}: {hint}") from None
    if parsed.tzinfo is None:
        if naive is not None:
            raise BadInputError(f"bad {what} {value!r}: {naive}")
        parsed = parsed.replace(tzinfo=timezone.utc)
    if not MIN_YEAR <= parsed.year <= MAX_YEAR:
        raise BadInputError(f"bad {what} {value!r}: the year must be {MIN_YEAR}-{MAX_YEAR}")
    return parsed
