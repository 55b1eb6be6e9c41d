"""The admin's page of the jobs in code: a proxy model (no table), for its place in the admin
and its permissions."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("oncely", "0003_oncely_schema")]

    operations = [
        migrations.CreateModel(
            name="CodeJob",
            fields=[],
            options={"verbose_name": "code job", "proxy": True, "indexes": [], "constraints": []},
            bases=("oncely.slotclaim",),
        ),
    ]
