"""The schema compatibility rule: which newer schemas a release still runs on."""

from __future__ import annotations

from oncely.store.migrations import (
    BREAKING,
    BREAKING_STEP,
    COMPATIBLE_UP_TO,
    LATEST,
    MIGRATIONS,
)


def test_a_breaking_migration_after_13_takes_a_multiple_of_the_step() -> None:
    versions = [version for version, _what, _step in MIGRATIONS]
    assert versions == sorted(set(versions))
    assert set(versions) >= BREAKING
    assert all(v % BREAKING_STEP == 0 for v in BREAKING if v > 13), BREAKING


def test_this_release_runs_up_to_the_next_breaking_number() -> None:
    assert LATEST <= COMPATIBLE_UP_TO < LATEST + BREAKING_STEP
    assert (COMPATIBLE_UP_TO + 1) % BREAKING_STEP == 0
