"""Handlers of any queue (Celery, RQ, SQS), written without oncely, for the toolkit to referee.

Each takes a message (an id and an order) and does the article's work: charge the provider,
record the payment, mark the message processed, all committed in the handler's own
transaction; `crash_point()` marks where its work ends and its commit (the ack) begins.
`charge_dedup` is correct: a processed-messages row in the same transaction, and a charge
whose idempotency key comes from the order. `charge_naive` is the naive one: no such row and
no key, so a redelivery or a crash before its commit charges twice.
"""

from __future__ import annotations

import sqlalchemy as sa
from tests.apps import shop

from oncely.testing import crash_point

HANDLER_TABLES = "CREATE TABLE IF NOT EXISTS processed (message_id varchar(64) PRIMARY KEY)"
MARK = sa.text("INSERT INTO processed (message_id) VALUES (:m) ON CONFLICT DO NOTHING")


async def charge_dedup(message_id: str, order_id: int) -> None:
    """Correct without oncely: the message's row commits with the payment, and the charge
    carries a key the provider deduplicates (so a retry after a crash charges once)."""
    async with shop.app.store.engine.begin() as conn:
        if (await conn.execute(MARK, {"m": message_id})).rowcount == 0:
            return  # processed before: already paid
        charge = shop.provider().charge(1000, idempotency_key=f"order:{order_id}")
        await conn.execute(shop.INSERT_PAYMENT, {"o": order_id, "c": charge["id"]})
        crash_point("charge_dedup", message_id)


async def charge_naive(message_id: str, order_id: int) -> None:
    """NOT idempotent: every delivery charges (no key) and records a payment."""
    async with shop.app.store.engine.begin() as conn:
        charge = shop.provider().charge(1000)
        await conn.execute(shop.INSERT_PAYMENT, {"o": order_id, "c": charge["id"]})
        crash_point("charge_naive", message_id)
