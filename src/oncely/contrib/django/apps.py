"""The Django app: `INSTALLED_APPS = [..., "oncely.contrib.django"]`."""

from __future__ import annotations

from django.apps import AppConfig


class OncelyConfig(AppConfig):
    """oncely's tables (its migration), their admin pages and `manage.py oncely`."""

    name = "oncely.contrib.django"
    label = "oncely"
    verbose_name = "oncely"
    default_auto_field = "django.db.models.BigAutoField"
