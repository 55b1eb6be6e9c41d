"""oncely's schema versions 17 (oncely_schedules: schedules kept as data) and 18 (the NOTIFY
trigger honours `oncely.notify`), by the same function
as 0001 (`oncely migrate`'s steps; a database already migrated gets none again), and the
model the admin lists the schedules by (unmanaged: written only through `app.schedules`)."""

from __future__ import annotations

import importlib

from django.db import migrations, models

migrate_oncely = importlib.import_module(
    "oncely.contrib.django.migrations.0001_initial"
).migrate_oncely


class Migration(migrations.Migration):
    dependencies = [("oncely", "0004_codejob")]

    operations = [
        migrations.RunPython(migrate_oncely, migrations.RunPython.noop, elidable=False),
        migrations.CreateModel(
            name="ScheduleRow",
            fields=[
                ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("cron", models.CharField(max_length=200, null=True)),
                ("every_seconds", models.FloatField(null=True)),
                ("tz", models.CharField(max_length=64)),
                ("target_kind", models.CharField(max_length=8)),
                ("target", models.CharField(max_length=200)),
                ("args", models.TextField()),
                ("catch_up", models.CharField(max_length=8)),
                ("grace_seconds", models.FloatField(null=True)),
                ("overlap", models.CharField(max_length=8)),
                ("timeout_seconds", models.FloatField(null=True)),
                ("state", models.CharField(max_length=8)),
                ("pause_reason", models.TextField(null=True)),
                ("next_slot", models.DateTimeField(null=True)),
                ("version", models.IntegerField()),
                ("created_at", models.DateTimeField()),
                ("changed_at", models.DateTimeField()),
                ("changed_by", models.CharField(max_length=255)),
            ],
            options={
                "verbose_name": "schedule",
                "db_table": "oncely_schedules",
                "ordering": ("name",),
                "managed": False,
            },
        ),
    ]
