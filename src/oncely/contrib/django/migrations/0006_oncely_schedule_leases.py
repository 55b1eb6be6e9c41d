"""oncely's schema version 19 (a due schedule's row leased to one worker at a time, on
Postgres), by the same function as 0001: `oncely migrate`'s steps, of which a database already
migrated gets none again."""

from __future__ import annotations

import importlib

from django.db import migrations

migrate_oncely = importlib.import_module(
    "oncely.contrib.django.migrations.0001_initial"
).migrate_oncely


class Migration(migrations.Migration):
    dependencies = [("oncely", "0005_oncely_schedules")]

    operations = [
        migrations.RunPython(migrate_oncely, migrations.RunPython.noop, elidable=False),
    ]
