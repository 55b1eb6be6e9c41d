"""Jobs for the export tests: every construct each target translates, and some it cannot."""

from __future__ import annotations

from oncely import Oncely, cron, every

app = Oncely("sqlite:///:memory:")

# One job per line: (name, schedule); each is exportable to every target unless noted.
JOBS = {
    "leaderboard_close": cron("0 18 * * FRI", tz="America/Mexico_City"),
    "weekday_mornings": cron("15 8 * * MON-FRI", tz="Europe/Madrid"),
    "quarter_hours": cron("*/15 9-17 * JAN-MAR,OCT *", tz="UTC"),
    "first_and_fifteenth": cron("0 6 1,15 * *", tz="Asia/Kolkata"),
    "every_five_minutes": every(minutes=5),
    "every_two_hours": every(hours=2),
}
# Only some targets: `L` and `#` (EventBridge, systemd), day OR (crontab, Kubernetes, systemd).
SPECIAL = {
    "month_end": cron("0 23 L * *", tz="UTC"),
    "second_tuesday": cron("30 7 * * TUE#2", tz="UTC"),
    "fifth_or_monday": cron("0 12 5 * MON", tz="UTC"),
}
# Only the embedded worker.
NOWHERE = {"every_seven_minutes": every(minutes=7)}
# A fixed time in New York's spring-forward gap: every target warns.
DST = {"nightly_230": cron("30 2 * * *", tz="America/New_York")}


def _noop(db: object, now: object) -> None:
    return None


for table in (JOBS, SPECIAL, NOWHERE, DST):
    for name, schedule in table.items():
        app.job(schedule, name=name)(_noop)
