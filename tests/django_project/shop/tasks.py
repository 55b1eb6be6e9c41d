try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

from .models import Receipt


@task()
def send_receipt(order_id):
    Receipt.objects.create(order_id=order_id)
    return order_id


@task(queue_name="mail")
def mail_receipt(order_id):
    Receipt.objects.create(order_id=order_id)
