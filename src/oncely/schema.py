"""oncely's tables for Alembic: `target_metadata = [app_metadata, oncely.schema.metadata]`."""

from __future__ import annotations

from .store.migrations import LATEST as SCHEMA_VERSION
from .store.tables import metadata, runs, schema_versions

__all__ = ["SCHEMA_VERSION", "metadata", "runs", "schema_versions"]
