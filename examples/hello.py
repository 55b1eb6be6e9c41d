"""Three "replicas" fire the same Friday 18:00 slot one minute apart: the bonus is paid once."""

from __future__ import annotations

import asyncio
import tempfile
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import sqlalchemy as sa

from oncely import Oncely, cron

MX = ZoneInfo("America/Mexico_City")


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        app = Oncely(f"sqlite:///{Path(tmp) / 'hello.db'}")

        @app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
        async def leaderboard_close(db, now):  # type: ignore[no-untyped-def]
            await db.execute(sa.text("INSERT INTO coins VALUES ('ana', 10)"))

        await app.migrate()
        async with app.store.engine.begin() as conn:
            await conn.exec_driver_sql("CREATE TABLE coins (member TEXT, amount INTEGER)")
        for minute in range(3):  # replica A at 18:00, B at 18:01, C at 18:02
            result = await app.run(
                "leaderboard_close", datetime(2026, 11, 27, 18, minute, tzinfo=MX)
            )
            print(f"replica {'ABC'[minute]}: {result.status.value} (key {result.key})")
        async with app.store.engine.connect() as conn:
            total = (await conn.execute(sa.text("SELECT sum(amount) FROM coins"))).scalar()
        print(f"ana's coins: +{total}")
        await app.aclose()


if __name__ == "__main__":
    asyncio.run(main())
