"""oncely.idempotency_key: stable, documented format, parts kept apart, bad parts refused."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncely import BadInputError, idempotency_key


def test_the_format_is_the_documented_one() -> None:
    expected = "ok1_" + hashlib.sha256(b'["charge",42]').hexdigest()[:32]
    assert idempotency_key("charge", 42) == expected
    # A golden value: changing the format would break every key users have already sent.
    assert idempotency_key("charge", 42) == "ok1_d60d1efef9d54734fbc1d8aaf80f40db"
    assert len(idempotency_key("x")) == 36


def test_parts_are_kept_apart() -> None:
    assert idempotency_key("a:b", "c") != idempotency_key("a", "b:c")
    assert idempotency_key("1") != idempotency_key(1)
    assert idempotency_key("a", "b") != idempotency_key("b", "a")
    assert idempotency_key("ab") != idempotency_key("a", "b")


def test_uuids_and_times_are_canonical() -> None:
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert idempotency_key(u) == idempotency_key(uuid.UUID(str(u).upper()))
    assert idempotency_key(u) != idempotency_key(str(u))
    utc = datetime(2026, 11, 28, 0, 0, tzinfo=timezone.utc)
    mexico = utc.astimezone(ZoneInfo("America/Mexico_City"))
    assert idempotency_key("bonus", utc) == idempotency_key("bonus", mexico)
    assert idempotency_key("bonus", utc) != idempotency_key("bonus", utc + timedelta(seconds=1))


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ((), "at least one part"),
        ((True,), "bool"),
        ((1.5,), "not float"),
        ((datetime(2026, 1, 1),), "no UTC offset"),
        ((None,), "not NoneType"),
    ],
)
def test_bad_parts_are_refused(parts: tuple[object, ...], message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        idempotency_key(*parts)  # type: ignore[arg-type]


@given(st.lists(st.one_of(st.text(), st.integers()), min_size=1, max_size=4), st.data())
def test_distinct_parts_give_distinct_keys(parts: list[str | int], data: st.DataObject) -> None:
    other = data.draw(st.lists(st.one_of(st.text(), st.integers()), min_size=1, max_size=4))
    key = idempotency_key(*parts)
    assert key == idempotency_key(*parts)
    assert key.startswith("ok1_") and len(key) == 36
    if other != parts or [type(p) for p in other] != [type(p) for p in parts]:
        assert idempotency_key(*other) != key
