"""A small Django project on SQLite ("default") and Postgres ("pg") for oncely's tests.

$SHOP_SQLITE is the SQLite file, $SHOP_PG_NAME the Postgres database (on
$ONCELY_TEST_POSTGRES_URL's server); $SHOP_DATABASE says which alias oncely uses.
"""

import os

from sqlalchemy.engine import make_url

from oncely import RetryPolicy

_PG = make_url(
    os.environ.get("ONCELY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
)

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["testserver", "localhost"]
ROOT_URLCONF = "shop.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "oncely.contrib.django",
    "shop",
]
try:
    import django.tasks  # noqa: F401  (Django 6)
except ImportError:
    INSTALLED_APPS.append("django_tasks")  # the backport, on Django 5.2

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_SQLITE", "shop.db"),
        "OPTIONS": {"timeout": 20},
        "TEST": {"NAME": os.environ.get("SHOP_SQLITE", "shop.db")},
    },
    "pg": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("SHOP_PG_NAME", "shop"),
        "USER": _PG.username or "",
        "PASSWORD": _PG.password or "",
        "HOST": _PG.host or "",
        "PORT": str(_PG.port or ""),
    },
    # Nothing listens there: a database that cannot be reached (with a password to mask).
    "down": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "shop",
        "USER": "shop",
        "PASSWORD": "s3cret-pw",
        "HOST": "127.0.0.1",
        "PORT": "1",
    },
}

ONCELY = {"APP": "shop.jobs:app", "DATABASE": os.environ.get("SHOP_DATABASE", "default")}

# One backend per database (a task's rows live where its backend's DATABASE says).
TASKS = {
    alias: {
        "BACKEND": "oncely.contrib.django.TaskBackend",
        "QUEUES": ["default", "mail"],
        "OPTIONS": {
            "DATABASE": alias,
            # The default policy for the others; three quick attempts for the flaky ones,
            # one for the stuck one (its timeout ends it).
            "TASK_RETRY": {
                "shop.tasks.flaky_receipt": {"attempts": 3, "wait": 0, "backoff": "fixed"},
                "shop.tasks.numbered_receipt": {"attempts": 3, "wait": 0, "backoff": "fixed"},
                "shop.tasks.stuck_receipt": {"attempts": 1},
                "shop.tasks.async_receipt": {"attempts": 2, "wait": 0, "backoff": "fixed"},
                "shop.tasks.declined_receipt": RetryPolicy(
                    attempts=5, wait=0, discard_on=[LookupError]
                ),
            },
            "TASK_TIMEOUT": {"shop.tasks.stuck_receipt": 0.5},
        },
    }
    for alias in ("default", "pg")
}

DATABASE_ROUTERS = ["oncely.contrib.django.routers.OncelyRouter"]
