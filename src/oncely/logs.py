"""Log output for oncely's events: plain text or one JSON object per line, passwords masked.

Every oncely log record carries `event` (a stable dotted name such as `run.skipped`) and
`fields` (job, key, slot, replica, duration_ms …), see `oncely.events`. `JsonFormatter` writes
them as one JSON object per line; both formatters mask any password in a URL
(`scheme://user:***@host`), whatever logger the line comes from.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

from .errors import BadOptionError
from .masking import mask_secrets

FORMATS = ("text", "json")


def mask_passwords(text: str) -> str:
    """The text with every credential of every URL in it replaced by *** (see masking)."""
    return mask_secrets(text)


def _masked(value: Any) -> Any:
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_masked(v) for v in value]
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return mask_secrets(str(value))


class TextFormatter(logging.Formatter):
    """`time LEVEL logger event: text key=value …`, passwords masked."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return mask_passwords(super().format(record))


def _message(record: logging.LogRecord) -> str:
    event = getattr(record, "event", None)
    args = record.args
    # oncely.events logs "%s: %s %s" % (event, text, fields): keep only the text.
    if event and isinstance(args, tuple) and len(args) == 3 and args[0] == event:
        return str(args[1])
    return record.getMessage()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, event, message, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
        }
        event = getattr(record, "event", None)
        if event:
            line["event"] = event
        line["message"] = _message(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for name, value in fields.items():
                line.setdefault(name, value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        # Masked value by value, before encoding: a quote in a password cannot hide it.
        masked = {name: _masked(value) for name, value in line.items()}
        return json.dumps(masked, default=str, ensure_ascii=False)


_format = "text"


def is_json() -> bool:
    """Whether `configure` last chose JSON lines (so tracebacks go out as JSON too)."""
    return _format == "json"


def traceback_line(error: BaseException) -> None:
    """Log a job's traceback as one `run.traceback` line (for JSON log output)."""
    logging.getLogger("oncely").error(
        "the job's traceback",
        exc_info=(type(error), error, error.__traceback__),
        extra={"event": "run.traceback", "fields": {"error": f"{type(error).__name__}: {error}"}},
    )


# Libraries whose debug output is about drivers and SQL, not about your jobs.
QUIET = ("sqlalchemy", "aiosqlite", "asyncpg", "asyncio", "urllib3")


def configure(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Send log lines to `stream` (stderr) at `level`, in `fmt` ("text" or "json").

    Your jobs' own loggers follow `level` too; database drivers and SQLAlchemy stay at
    WARNING and above, so `--log-level debug` is about oncely and your code.
    """
    global _format
    if fmt not in FORMATS:
        raise BadOptionError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    _format = fmt
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_oncely", False):
            root.removeHandler(old)
    handler._oncely = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    numeric = logging.getLevelName(level.upper())
    root.setLevel(numeric)
    logging.getLogger("oncely").setLevel(numeric)
    for name in QUIET:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
