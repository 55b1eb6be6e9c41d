"""`claim(job, key)` and `@once` on Django's transaction, on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import pytest
from shop_helpers import count

from oncely import BadInputError, events


def test_claim_commits_with_the_atomic_block_or_not_at_all(alias: str) -> None:
    from django.db import transaction
    from shop.models import Bonus

    from oncely.contrib.django import claim

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic(using=alias):
        assert claim("invoices", "2026-05", using=alias)
        Bonus.objects.using(alias).create(member="ana", week="w1")
        raise Boom
    assert count(alias, "oncely_runs") == 0  # the rollback freed the key ...
    assert count(alias, "shop_bonus") == 0  # ... and took the work with it

    with transaction.atomic(using=alias):
        assert claim("invoices", "2026-05", using=alias)
        Bonus.objects.using(alias).create(member="ana", week="w1")
    with transaction.atomic(using=alias):
        assert not claim("invoices", "2026-05", using=alias)  # committed: a duplicate
    assert count(alias, "oncely_runs", "WHERE job = 'invoices'") == 1
    assert count(alias, "shop_bonus") == 1


def test_claim_outside_an_atomic_block_is_refused_and_sends_nothing(alias: str) -> None:
    from oncely.contrib.django import claim

    with pytest.raises(BadInputError, match=r"transaction\.atomic"):
        claim("invoices", "2026-05", using=alias)
    assert count(alias, "oncely_runs") == 0


def test_once_runs_once_per_key_and_reports_the_duplicate(alias: str) -> None:
    from shop.models import Receipt

    from oncely.contrib.django import once

    seen: list[tuple[str, dict[str, Any]]] = []

    def observer(event: str, fields: dict[str, Any]) -> None:
        seen.append((event, fields))

    @once(key=lambda order_id: f"receipt:{order_id}", using=alias)
    def send_receipt(order_id: int) -> int:
        Receipt.objects.using(alias).create(order_id=order_id)
        return order_id

    events.subscribe(observer)
    try:
        first = send_receipt(42)
        second = send_receipt(42)
    finally:
        events.unsubscribe(observer)
    assert first.ran and first.value == 42
    assert second.skipped and second.value is None
    assert second.claim is not None and second.claim.claimed_by == first_claimer(alias)
    assert count(alias, "shop_receipt") == 1
    skipped = [f for e, f in seen if e == "effect.skipped"]
    assert len(skipped) == 1 and skipped[0]["key"] == "receipt:42"
    assert skipped[0]["job"] == "@effect"


def first_claimer(alias: str) -> str:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT claimed_by FROM oncely_runs WHERE key = %s", ["receipt:42"])
        return str(cursor.fetchone()[0])


def test_once_rolls_back_and_frees_the_key_when_the_function_raises(alias: str) -> None:
    from shop.models import Receipt

    from oncely.contrib.django import once

    calls = []

    @once(key=lambda order_id: f"receipt:{order_id}", using=alias)
    def flaky(order_id: int) -> None:
        Receipt.objects.using(alias).create(order_id=order_id)
        calls.append(order_id)
        if len(calls) == 1:
            raise RuntimeError("gateway timeout")

    with pytest.raises(RuntimeError):
        flaky(7)
    assert count(alias, "shop_receipt") == 0 and count(alias, "oncely_runs") == 0
    assert flaky(7).ran  # the retry runs clean
    assert count(alias, "shop_receipt") == 1
