"""The next release of rename_app: its `report` job is called `daily_report` now (the
release `oncely rename report daily_report` is run with)."""

from __future__ import annotations

from tests.apps.rename_app import reporting

from oncely import Oncely, RetryPolicy, every

app = Oncely()

app.job(every(seconds=1), name="daily_report", retry=RetryPolicy(attempts=1))(
    reporting("daily_report")
)
