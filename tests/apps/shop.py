"""A shop whose handlers a queue (Celery, RQ, oncely's own) delivers at least once.

`charge_order` is the article's handler, done right: the charge carries an idempotency key
derived from the order, and the payment row commits with the key's claim. The others are
deliberately NOT idempotent, so the toolkit's tests can show its assertions failing:
`charge_order_no_claim` claims nothing, `charge_order_key_outside` charges without a key
(a side effect outside the transaction), and `bonus_outside` is a scheduled job that does so.
"""

from __future__ import annotations

import sqlalchemy as sa

from oncely import Oncely, cron, idempotency_key
from oncely.testing import FakeProvider

app = Oncely()

SHOP_TABLES = "CREATE TABLE IF NOT EXISTS payments (order_id integer, charge_id varchar(40))"
INSERT_PAYMENT = sa.text("INSERT INTO payments (order_id, charge_id) VALUES (:o, :c)")


def payments(engine: sa.Engine) -> int:
    """How many payment rows the shop recorded (the effect in its own database)."""
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM payments")).scalar_one())


def provider() -> FakeProvider:
    return FakeProvider.from_env()


@app.once(key=lambda order_id: f"charge:{order_id}")
async def charge_order(db, order_id: int) -> str:  # type: ignore[no-untyped-def]
    charge = provider().charge(1000, idempotency_key=idempotency_key("charge", order_id))
    await db.execute(INSERT_PAYMENT, {"o": order_id, "c": charge["id"]})
    return str(charge["id"])


@app.once(key=lambda order_id: f"charge:{order_id}")
def charge_order_sync(session, order_id: int) -> str:  # type: ignore[no-untyped-def]
    """The same handler for a synchronous worker (Celery, RQ): a Session, no event loop."""
    charge = provider().charge(1000, idempotency_key=idempotency_key("charge", order_id))
    session.execute(INSERT_PAYMENT, {"o": order_id, "c": charge["id"]})
    return str(charge["id"])


async def charge_order_no_claim(order_id: int) -> str:
    """NOT idempotent: its own transaction, no claim; every delivery charges and records."""
    charge = provider().charge(1000)
    async with app.store.engine.begin() as conn:
        await conn.execute(INSERT_PAYMENT, {"o": order_id, "c": charge["id"]})
    return str(charge["id"])


@app.once(key=lambda order_id: f"charge-outside:{order_id}")
async def charge_order_key_outside(db, order_id: int) -> str:  # type: ignore[no-untyped-def]
    """NOT idempotent across a crash: the charge has no idempotency key, so it is an effect
    outside the transaction that a crash before the commit cannot take back."""
    charge = provider().charge(1000)
    await db.execute(INSERT_PAYMENT, {"o": order_id, "c": charge["id"]})
    return str(charge["id"])


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
async def bonus(db, now):  # type: ignore[no-untyped-def]
    """Pays the weekly bonus through the provider with a key derived from the slot."""
    provider().charge(500, idempotency_key=idempotency_key("bonus", now))
    await db.execute(INSERT_PAYMENT, {"o": 0, "c": "bonus"})


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
async def bonus_outside(db, now):  # type: ignore[no-untyped-def]
    """NOT idempotent across a crash: the provider call has no key."""
    provider().charge(500)
    await db.execute(INSERT_PAYMENT, {"o": 0, "c": "bonus"})


@app.task
async def charge_order_task(db, order_id: int) -> None:  # type: ignore[no-untyped-def]
    """The article's handler as an oncely task: the payment row commits with the task's ack,
    and the charge carries a key derived from the order."""
    charge = provider().charge(1000, idempotency_key=idempotency_key("charge", order_id))
    await db.execute(INSERT_PAYMENT, {"o": order_id, "c": charge["id"]})


@app.task
async def charge_order_task_key_outside(db, order_id: int) -> None:  # type: ignore[no-untyped-def]
    """NOT idempotent across a crash: the charge has no idempotency key, an effect outside the
    transaction that a crash before the commit cannot take back."""
    charge = provider().charge(1000)
    await db.execute(INSERT_PAYMENT, {"o": order_id, "c": charge["id"]})
