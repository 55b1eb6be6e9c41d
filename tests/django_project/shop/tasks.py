import inspect
import os
import signal
import time
from pathlib import Path

from oncely import hooks

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

from .models import Receipt


@task()
def send_receipt(order_id, using="default"):
    # On the database of the transaction the task runs in (the worker's alias).
    Receipt.objects.using(using).create(order_id=order_id)
    return order_id


@task(queue_name="mail")
def mail_receipt(order_id):
    Receipt.objects.create(order_id=order_id)


@task()
def flaky_receipt(order_id, marker, using="default", fail=1):
    # Each attempt leaves a line in `marker` (outside the transaction); the first `fail`
    # attempts raise after their ORM work, which rolls back with them.
    with open(marker, "a") as out:
        out.write("attempt\n")
    Receipt.objects.using(using).create(order_id=order_id)
    if len(Path(marker).read_text().splitlines()) <= fail:
        raise RuntimeError("the payment gateway timed out")
    return order_id


@task()
def slow_receipt(order_id, using="default", seconds=3.0):
    time.sleep(seconds)  # a slow sync task: the worker's other threads go on meanwhile
    Receipt.objects.using(using).create(order_id=order_id)


@task(takes_context=True)
def numbered_receipt(context, order_id, marker, using="default", fail=1):
    # Each attempt writes its number and what its TaskResult says (outside the transaction);
    # the first `fail` attempts raise after their ORM work, which rolls back with them.
    result = context.task_result
    with open(marker, "a") as out:
        out.write(f"{context.attempt} {result.id} {result.status.name}\n")
    Receipt.objects.using(using).create(order_id=order_id)
    if context.attempt <= fail:
        raise RuntimeError(f"attempt {context.attempt} failed")
    return {"order": order_id, "attempt": context.attempt}


@task()
def declined_receipt(order_id, using="default"):
    # Its policy discards a LookupError at once (TASK_RETRY's discard_on): no retry.
    Receipt.objects.using(using).create(order_id=order_id)
    raise KeyError(f"order {order_id} is gone")


@task()
def stuck_receipt(order_id, using="default", seconds=2.0):
    # Past its timeout (TASK_TIMEOUT): the worker gives the attempt up while it sleeps.
    time.sleep(seconds)
    Receipt.objects.using(using).create(order_id=order_id)
    return order_id


@task()
async def async_receipt(order_id, using="default", fail=False):
    # An `async def` task on the async ORM: its write commits with the attempt's ack, or
    # rolls back with it when it raises after the write.
    await Receipt.objects.using(using).acreate(order_id=order_id)
    if fail:
        raise RuntimeError(f"order {order_id} failed after its write")
    return {"order": order_id, "count": await Receipt.objects.using(using).acount()}


@task(takes_context=True)
async def async_numbered_receipt(context, order_id, using="default"):
    await Receipt.objects.using(using).acreate(order_id=order_id)
    return context.attempt


TASK_OPTIONS = "kwargs" in inspect.signature(task).parameters
"""Django's `@task` hands options to the backend's task class (6.1, the backport); 6.0 not."""

if TASK_OPTIONS:

    @task(retry={"attempts": 2, "wait": 0, "backoff": "fixed"}, timeout=30)
    def patient_receipt(order_id, marker, using="default"):
        # Its own policy (the decorator's): two attempts, both failing after their write.
        with open(marker, "a") as out:
            out.write("attempt\n")
        Receipt.objects.using(using).create(order_id=order_id)
        raise RuntimeError("the courier did not come")


if os.environ.get("SHOP_KILL_TASK_BEFORE_COMMIT"):
    # A real crash between a task's work (and ack) and its commit: SIGKILL there.
    hooks.add_before_commit(
        lambda name, key: (
            os.kill(os.getpid(), signal.SIGKILL) if name.startswith("shop.tasks.") else None
        )
    )
