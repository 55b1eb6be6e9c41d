"""The incident's app: a community leaderboard that closes every Friday 18:00 in Mexico City.

Members earn activity points during the week. Closing the week pays the top 3 members +10
coins, notifies each of them and posts a summary thread in the `general` section. Three
versions of "run it once" are here, as in the incident write-up:

- `naive_tick`: a worker loop tick guarded by a per-tick try-lock that the tick's own commit
  releases (Postgres `pg_try_advisory_xact_lock`; on SQLite, `BEGIN IMMEDIATE` without
  waiting, which is the same kind of lock: held by one transaction, gone at its commit);
- `sentinel_tick`: the same, plus "skip if this week's summary thread exists", where posting
  the thread is best-effort and returns None when the section is missing;
- `app` / `leaderboard_close`: an oncely job; the slot's claim commits with the work.

All rows carry a `scenario` column so the three runs can share one database.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from ..app import Oncely
from ..identity import replica_id
from ..schedule import cron

MEXICO_CITY = ZoneInfo("America/Mexico_City")
BONUS = 10
LOCK_KEY = 0x4D424F54  # the article's arbitrary 32-bit advisory lock key
log = logging.getLogger("demo.leaderboard")

metadata = sa.MetaData()
members = sa.Table(
    "demo_members",
    metadata,
    sa.Column("scenario", sa.String(20), primary_key=True),
    sa.Column("name", sa.String(50), primary_key=True),
)
activity = sa.Table(
    "demo_activity",
    metadata,
    sa.Column("scenario", sa.String(20), nullable=False),
    sa.Column("member", sa.String(50), nullable=False),
    sa.Column("week", sa.String(10), nullable=False),
    sa.Column("points", sa.Integer, nullable=False),
)
coins = sa.Table(
    "demo_coins",
    metadata,
    sa.Column("scenario", sa.String(20), nullable=False),
    sa.Column("member", sa.String(50), nullable=False),
    sa.Column("amount", sa.Integer, nullable=False),
    sa.Column("reason", sa.String(100), nullable=False),
    sa.Column("replica", sa.String(50), nullable=False),
)
notifications = sa.Table(
    "demo_notifications",
    metadata,
    sa.Column("scenario", sa.String(20), nullable=False),
    sa.Column("member", sa.String(50), nullable=False),
    sa.Column("body", sa.String(200), nullable=False),
    sa.Column("replica", sa.String(50), nullable=False),
)
sections = sa.Table(
    "demo_sections",
    metadata,
    sa.Column("scenario", sa.String(20), primary_key=True),
    sa.Column("slug", sa.String(50), primary_key=True),
)
threads = sa.Table(
    "demo_threads",
    metadata,
    sa.Column("scenario", sa.String(20), nullable=False),
    sa.Column("section", sa.String(50), nullable=False),
    sa.Column("title", sa.String(200), nullable=False),
    sa.Column("body", sa.String(2000), nullable=False),
)

# The week's activity: ana, beto and carla are the top 3.
POINTS = {"ana": 120, "beto": 95, "carla": 80, "diego": 40, "elena": 15}
TOP3 = ("ana", "beto", "carla")

Db = AsyncSession | AsyncConnection


def week_key(now: datetime) -> str:
    """The ISO week a slot belongs to, e.g. 2026-W22: the incident's claim key."""
    year, week, _ = now.astimezone(MEXICO_CITY).isocalendar()
    return f"{year}-W{week:02d}"


def summary_title(now: datetime) -> str:
    """The summary thread's title, which the sentinel variant looks for."""
    return f"Top 3 of the week - {now.astimezone(MEXICO_CITY):%d %b %Y}"


def seed_rows(
    scenario: str, week: str, *, section: str
) -> list[tuple[sa.Table, list[dict[str, Any]]]]:
    """One scenario's starting data: members, the week's activity and the forum's section."""
    return [
        (members, [{"scenario": scenario, "name": name} for name in POINTS]),
        (
            activity,
            [
                {"scenario": scenario, "member": name, "week": week, "points": points}
                for name, points in POINTS.items()
            ],
        ),
        (sections, [{"scenario": scenario, "slug": section}]),
    ]


async def post_thread(db: Db, scenario: str, *, section: str, title: str, body: str) -> bool | None:
    """Best effort, like the incident's bot service: a missing section returns None, silently."""
    found = (
        await db.execute(
            sa.select(sections.c.slug).where(
                sections.c.scenario == scenario, sections.c.slug == section
            )
        )
    ).first()
    if found is None:
        log.warning("post_thread: section %s missing", section)
        return None  # the silent failure
    await db.execute(
        threads.insert().values(scenario=scenario, section=section, title=title, body=body)
    )
    return True


async def close_week(db: Db, scenario: str, now: datetime, replica: str) -> list[str]:
    """Pay the week's top 3, notify them and post the summary thread; the members paid."""
    week = week_key(now)
    top = [
        row.member
        for row in await db.execute(
            sa.select(activity.c.member, sa.func.sum(activity.c.points).label("total"))
            .where(activity.c.scenario == scenario, activity.c.week == week)
            .group_by(activity.c.member)
            .order_by(sa.desc("total"), activity.c.member)
            .limit(3)
        )
    ]
    for member in top:
        await db.execute(
            coins.insert().values(
                scenario=scenario,
                member=member,
                amount=BONUS,
                reason=f"top 3 {week}",
                replica=replica,
            )
        )
        await db.execute(
            notifications.insert().values(
                scenario=scenario,
                member=member,
                body=f"You're in the top 3! +{BONUS} coins for your activity this week.",
                replica=replica,
            )
        )
    await post_thread(
        db,
        scenario,
        section="general",
        title=summary_title(now),
        body="\n".join(f"{i}. {m}" for i, m in enumerate(top, 1)),
    )
    return top


def in_friday_window(now: datetime) -> bool:
    """The worker loop's wall-clock branch: Friday, 18:00 to 18:14 in Mexico City."""
    local = now.astimezone(MEXICO_CITY)
    return local.weekday() == 4 and local.hour == 18 and local.minute < 15


async def try_tick_lock(conn: AsyncConnection) -> bool:
    """The per-tick try-lock: never waits, and the tick's commit releases it."""
    if conn.dialect.name == "postgresql":
        got = await conn.scalar(sa.text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
        return bool(got)
    try:  # SQLite: take the write lock now or not at all (busy_timeout is 0)
        await conn.exec_driver_sql("BEGIN IMMEDIATE")
    except sa.exc.OperationalError as exc:
        if "locked" in str(exc):
            return False
        raise
    return True


async def naive_tick(conn: AsyncConnection, scenario: str, now: datetime, replica: str) -> str:
    """Attempt 1: the worker loop's tick with only the try-lock; what happened, in words."""
    if not await try_tick_lock(conn):
        return "try-lock held by another replica: skipped this tick"
    if not in_friday_window(now):
        await conn.commit()
        return "not Friday 18:00-18:14: nothing to do"
    top = await close_week(conn, scenario, now, replica)
    await conn.commit()
    return f"try-lock acquired; Friday window -> closed the week: +{BONUS} to {', '.join(top)}"


async def sentinel_tick(conn: AsyncConnection, scenario: str, now: datetime, replica: str) -> str:
    """Attempt 2: the try-lock plus "skip if this week's summary thread exists"."""
    if not await try_tick_lock(conn):
        return "try-lock held by another replica: skipped this tick"
    if not in_friday_window(now):
        await conn.commit()
        return "not Friday 18:00-18:14: nothing to do"
    title = summary_title(now)
    existing = (
        await conn.execute(
            sa.select(threads.c.title).where(
                threads.c.scenario == scenario, threads.c.title == title
            )
        )
    ).first()
    if existing is not None:
        await conn.commit()
        return f"summary thread {title!r} exists: already ran, skipping"
    top = await close_week(conn, scenario, now, replica)
    await conn.commit()
    return (
        f"no summary thread yet -> closed the week: +{BONUS} to {', '.join(top)} "
        "(post_thread returned None: section 'general' is missing)"
    )


# -- the oncely version -------------------------------------------------------------------

ONCELY_SCENARIO = "oncely"
REPLICA_ENV = "ONCELY_DEMO_REPLICA"
app = Oncely()


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"), key=week_key)
async def leaderboard_close(db: AsyncSession, now: datetime) -> None:
    """The same work, unchanged (its helper is still best-effort); oncely claims the slot."""
    await close_week(db, ONCELY_SCENARIO, now, os.environ.get(REPLICA_ENV) or replica_id())
