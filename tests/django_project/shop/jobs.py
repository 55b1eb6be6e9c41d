"""The incident's job, on the ORM: +10 coins to the week's top member, once per Friday."""

import os
import signal

from oncely import cron, every, hooks
from oncely.contrib.django import Oncely

from .models import Bonus

app = Oncely()


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
def leaderboard_close(now):
    # On the database the claim is on (the alias ONCELY["DATABASE"] names): one transaction.
    Bonus.objects.using(app.alias).create(member="ana", week=now.strftime("%G-W%V"))
    if os.environ.get("SHOP_FAIL_AFTER_WORK"):
        raise RuntimeError("the job failed after its work")


@app.job(every(seconds=1), catch_up="none")
def tick(now):
    Bonus.objects.using(app.alias).create(member="tick", week=now.strftime("%H:%M:%S"))


@app.job(cron("0 0 1 1 *"))
def digest(now, customer="all"):
    # Once a year in code; the schedules kept as data call it with their own arguments.
    week = now.strftime("%H:%M:%S")
    Bonus.objects.using(app.alias).create(member=f"digest:{customer}", week=week)
    if customer == "gone":
        raise LookupError(f"customer {customer} is gone")


if os.environ.get("SHOP_KILL_BEFORE_COMMIT"):
    # A real crash between the job's work and its commit: this process is SIGKILLed there.
    hooks.add_before_commit(lambda job, key: os.kill(os.getpid(), signal.SIGKILL))
