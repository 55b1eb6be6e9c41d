from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Bonus",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("member", models.CharField(max_length=50)),
                ("week", models.CharField(max_length=20)),
                ("coins", models.IntegerField(default=10)),
            ],
        ),
        migrations.CreateModel(
            name="Receipt",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("order_id", models.IntegerField()),
            ],
        ),
    ]
