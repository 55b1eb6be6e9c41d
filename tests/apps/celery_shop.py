"""A real Celery app whose task makes the shop's charge once with `app.once`.

The task is `acks_late`: the message is acknowledged only after the task returns, so a
worker that dies mid-task gets its message redelivered. On its first delivery (until the
test creates SIGNAL_DIR/release) the task stops right after the effect committed, before the
ack, and waits to be SIGKILLed. With safe=False it runs a handler without `app.once`, to
show the same test failing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import sqlalchemy as sa
from celery import Celery
from tests.apps import shop

REDIS_URL = os.environ.get("ONCELY_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")
SIGNAL_DIR = Path(os.environ.get("ONCELY_TEST_SIGNALS", "."))

celery = Celery("oncely_shop", broker=REDIS_URL)
celery.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    # An unacknowledged message goes back to the queue after 2 s (default: an hour); the
    # worker looks for such messages every second (default: every 100 s).
    broker_transport_options={
        "visibility_timeout": 2,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
)


def charge_unsafe(order_id: int) -> str:
    """NOT idempotent: charges without a key and records in its own transaction, no claim."""
    charge = shop.provider().charge(1000)
    engine = sa.create_engine(os.environ["ONCELY_DATABASE_URL"])
    with engine.begin() as conn:
        conn.execute(shop.INSERT_PAYMENT, {"o": order_id, "c": charge["id"]})
    engine.dispose()
    return "ran"


@celery.task(acks_late=True, name="shop.charge")
def charge(order_id: int, safe: bool = True) -> str:
    status = shop.charge_order_sync(order_id).status.value if safe else charge_unsafe(order_id)
    (SIGNAL_DIR / f"delivered-{os.getpid()}-{status}").touch()
    if not (SIGNAL_DIR / "release").exists():
        (SIGNAL_DIR / "committed").touch()  # the effect is committed; the ack is not sent
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)  # waiting to be SIGKILLed
        raise TimeoutError("the test never killed this worker")
    return status
