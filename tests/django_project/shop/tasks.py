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
