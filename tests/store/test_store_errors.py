"""What a store operation raises for a value it refuses: oncely's error, not SQLAlchemy's."""

from __future__ import annotations

from datetime import datetime

import pytest

from oncely import Oncely, OncelyError
from oncely.errors import BadTimeError


async def test_a_naive_time_given_to_a_store_operation_is_a_bad_time_error(db_url: str) -> None:
    app = Oncely(db_url)
    await app.migrate()
    try:
        with pytest.raises(BadTimeError, match="timezone-aware") as raised:
            await app.store.tasks.prune(datetime(2026, 5, 29, 18, 0))
        assert isinstance(raised.value, OncelyError)
        assert await app.store.tasks.count() == {}  # nothing was deleted, nothing changed
    finally:
        await app.aclose()
