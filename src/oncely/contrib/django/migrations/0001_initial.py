"""oncely's tables, by `oncely migrate`'s own steps run on Django's connection.

`manage.py migrate` runs the same function as `oncely migrate` (store.migrations), inside the
migration's transaction: the tables, indexes and Postgres trigger are those of `oncely
migrate`, and a database already migrated by `oncely migrate` is left as it is. A later
oncely schema version comes with a later migration here that runs the same function.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

from oncely.errors import SchemaTooNewError
from oncely.store import borrowed


def _too_new(version: int) -> Exception:
    return SchemaTooNewError(
        f"oncely's tables are at schema version {version}, newer than this oncely knows: "
        "upgrade oncely to the release that migrated them"
    )


def migrate_oncely(apps: Any, schema_editor: Any) -> None:
    """`oncely migrate` on the migration's connection, in its transaction."""
    conn = schema_editor.connection
    conn.ensure_connection()
    with borrowed.borrow(conn.connection, conn.vendor) as sa_conn:
        borrowed.migrate(sa_conn, _too_new)


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.RunPython(migrate_oncely, migrations.RunPython.noop, elidable=False),
        # The models Django knows the tables by (unmanaged: Django creates and alters nothing).
        migrations.CreateModel(
            name="SlotClaim",
            fields=[
                ("job", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=200)),
                ("scheduled_for", models.DateTimeField(null=True)),
                ("claimed_at", models.DateTimeField()),
                ("claimed_by", models.CharField(max_length=255)),
                ("finished_at", models.DateTimeField(null=True)),
            ],
            options={
                "verbose_name": "slot claim",
                "db_table": "oncely_runs",
                "ordering": ("-claimed_at",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="TaskRow",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("task", models.CharField(max_length=200)),
                ("queue", models.CharField(max_length=100)),
                ("args", models.JSONField()),
                ("state", models.CharField(max_length=16)),
                ("attempt", models.IntegerField()),
                ("run_at", models.DateTimeField()),
                ("created_at", models.DateTimeField()),
                ("idempotency_key", models.CharField(max_length=255, null=True)),
                ("lease_token", models.CharField(max_length=64, null=True)),
                ("locked_by", models.CharField(max_length=255, null=True)),
                ("started_at", models.DateTimeField(null=True)),
                ("lease_expires_at", models.DateTimeField(null=True)),
                ("finished_at", models.DateTimeField(null=True)),
                ("error", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "task",
                "db_table": "oncely_tasks",
                "ordering": ("-id",),
                "managed": False,
            },
        ),
    ]
