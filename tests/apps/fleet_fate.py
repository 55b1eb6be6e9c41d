"""Jobs whose every attempt fails, times out or hangs until cancelled: for the fleet tests of a
slot's fate (tests/worker/test_slot_fate.py).

Each call leaves a file `call-<job>-<key>-<pid>-<n>` in $ONCELY_TEST_SIGNALS, outside the
job's transaction (which rolls back): what the tests count, per slot, across processes.
`boom` raises after 0.3 s; `late` runs past its 0.3 s timeout (both with one attempt: given up
at their first failure, where the default policy would retry them); `stuck` waits (forever) to be
cancelled; `flaky` raises, under a retry policy of 2 attempts 0.5 s apart.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from datetime import datetime, timedelta
from pathlib import Path

from oncely import Oncely, RetryPolicy, every

app = Oncely()
SIGNAL_DIR = Path(os.environ.get("ONCELY_TEST_SIGNALS", "."))
_calls = itertools.count()


def called(job: str, now: datetime) -> None:
    key = now.strftime("%H%M%S")
    (SIGNAL_DIR / f"call-{job}-{key}-{os.getpid()}-{next(_calls)}").touch()


@app.job(every(seconds=2), catch_up="none", retry=RetryPolicy(attempts=1))
async def boom(db, now):  # type: ignore[no-untyped-def]
    called("boom", now)
    await asyncio.sleep(0.3)
    raise RuntimeError("boom")


@app.job(
    every(seconds=2),
    catch_up="none",
    timeout=timedelta(seconds=0.3),
    retry=RetryPolicy(attempts=1),
)
async def late(db, now):  # type: ignore[no-untyped-def]
    called("late", now)
    await asyncio.sleep(5)


@app.job(every(seconds=5), catch_up="none")
async def stuck(db, now):  # type: ignore[no-untyped-def]
    called("stuck", now)
    await asyncio.sleep(600)


@app.job(
    every(seconds=3),
    catch_up="none",
    retry=RetryPolicy(attempts=2, wait=0.5, backoff="fixed", jitter=0),
)
async def flaky(db, now):  # type: ignore[no-untyped-def]
    called("flaky", now)
    await asyncio.sleep(0.1)
    raise RuntimeError("flaky")
