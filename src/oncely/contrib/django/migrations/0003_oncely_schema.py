"""oncely's schema versions since 0002 (v11: every failed task attempt's error, v12: the
NOTIFY trigger's transaction id, v13: the ack function, v14: a slot's given-up mark, and the
later ones of this release), by the same function as 0001: `oncely migrate`'s steps, of which a
database already migrated gets none again; and the model the admin reads each task's attempt
history by (unmanaged, like 0001's). A release that adds schema versions adds a migration
that runs the same function again."""

from __future__ import annotations

import importlib

from django.db import migrations, models

migrate_oncely = importlib.import_module(
    "oncely.contrib.django.migrations.0001_initial"
).migrate_oncely


class Migration(migrations.Migration):
    dependencies = [("oncely", "0002_oncely_schema")]

    operations = [
        migrations.RunPython(migrate_oncely, migrations.RunPython.noop, elidable=False),
        migrations.CreateModel(
            name="TaskErrorRow",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("task_id", models.BigIntegerField()),
                ("attempt", models.IntegerField()),
                ("error", models.TextField(null=True)),
                ("by", models.CharField(max_length=255, null=True)),
                ("at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "task error",
                "db_table": "oncely_task_errors",
                "ordering": ("id",),
                "managed": False,
            },
        ),
    ]
