"""An app for the dashboard's tests: jobs whose history a test scripts by running slots
(`hourly` writes, `boom` raises and is given up at its first failure, `nightly` keeps New
York's time), and tasks to list, retry and discard (`charge` takes a card number the tests
redact). `build(url)` makes a fresh one
per test; `app` is the one `--app tests.apps.web_app:app` loads."""

from __future__ import annotations

from oncely import Oncely, RetryPolicy, cron, every


async def _nothing(db, now):  # type: ignore[no-untyped-def]
    pass


async def _boom(db, now):  # type: ignore[no-untyped-def]
    raise RuntimeError("the tax API returned 500")


async def _charge(db, order_id: int, card: str = "4111111111111111"):  # type: ignore[no-untyped-def]
    pass


async def _send_receipt(db, order_id: int):  # type: ignore[no-untyped-def]
    pass


def build(database: str | None = None) -> Oncely:
    """The test app on `database` (default: $ONCELY_DATABASE_URL)."""
    app = Oncely(database)
    app.job(every(hours=1), name="hourly")(_nothing)
    app.job(every(hours=1), name="boom", retry=RetryPolicy(attempts=1))(_boom)  # given up at once
    app.job(cron("30 2 * * *", tz="America/New_York"), name="nightly")(_nothing)
    app.task(name="charge", queue="payments")(_charge)
    app.task(name="send_receipt")(_send_receipt)
    return app


app = build()
