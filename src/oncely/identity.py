"""Who is running: the `host:pid` recorded on every claim."""

from __future__ import annotations

import os
import socket


def replica_id() -> str:
    """This process as `host:pid`, the value of `claimed_by`."""
    return f"{socket.gethostname()}:{os.getpid()}"
