"""Every SQL statement oncely runs, and the only code that knows Postgres from SQLite.

This module is the package's face: the operations and names the rest of oncely uses. `Store`
(store.py) holds one database's engine and runs every statement on it; the dialect files
(postgres.py, sqlite.py) are the only ones that know one database from the other.
"""

from __future__ import annotations

from ..masking import mask_url
from .claims import claim_run, claim_run_sync
from .dialect import ClaimOutcome, ClaimRequest
from .dialects import dialect_for
from .migrations import LATEST
from .session import AttemptSession, violation
from .store import Store
from .tables import metadata
from .urls import normalize_url, sync_url

__all__ = [
    "LATEST",
    "AttemptSession",
    "ClaimOutcome",
    "ClaimRequest",
    "Store",
    "claim_run",
    "claim_run_sync",
    "dialect_for",
    "mask_url",
    "metadata",
    "normalize_url",
    "sync_url",
    "violation",
]
