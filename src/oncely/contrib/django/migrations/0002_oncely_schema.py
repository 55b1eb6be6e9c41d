"""oncely's later schema versions (v7: the dead tasks' index, v8: suppressed duplicates, v9:
the tasks' trace context, v10: the indexes that let an idle worker wait for the next task's
time and list each job's newest slot), by the same function as 0001: `oncely migrate`'s
steps, of which a database already migrated gets none again."""

from __future__ import annotations

import importlib

from django.db import migrations

migrate_oncely = importlib.import_module(
    "oncely.contrib.django.migrations.0001_initial"
).migrate_oncely


class Migration(migrations.Migration):
    dependencies = [("oncely", "0001_initial")]

    operations = [
        migrations.RunPython(migrate_oncely, migrations.RunPython.noop, elidable=False),
    ]
