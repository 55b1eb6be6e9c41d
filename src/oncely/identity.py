"""Who is running: the name recorded on every claim, `$ONCELY_REPLICA` or `host:pid`."""

from __future__ import annotations

import getpass
import os
import socket

REPLICA_ENV = "ONCELY_REPLICA"


def replica_id() -> str:
    """This process's name for `claimed_by`: `$ONCELY_REPLICA` (e.g. `web-2`), else `host:pid`."""
    name = os.environ.get(REPLICA_ENV, "").strip()
    return name or f"{socket.gethostname()}:{os.getpid()}"


def default_actor() -> str:
    """Who an operator's action is recorded as when they do not say: `user@host`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a bare container)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"
