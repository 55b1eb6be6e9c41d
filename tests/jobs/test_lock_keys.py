"""Advisory-lock keys use all 64 bits: two jobs never block each other by a hash collision."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import datetime, timezone

import pytest

from oncely import ConfigError, Oncely, RunStatus, every, locks

NOW = datetime(2026, 11, 29, 10, 7, tzinfo=timezone.utc)
# Under the old 32-bit job-lock hash (BLAKE2b-32 of "name\0") these two names collide.
PAIR = ("report_48838", "report_73784")


@pytest.mark.postgres
async def test_jobs_whose_32_bit_lock_ids_collide_do_not_overlap(postgres_database: str) -> None:
    from tests.conftest import _reset_postgres

    _reset_postgres(postgres_database)
    app = Oncely(postgres_database)
    await app.migrate()
    inside, release = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    @app.job(every(minutes=1), name=PAIR[0], overlap="skip")
    async def first(db, now):  # type: ignore[no-untyped-def]
        ran.append(PAIR[0])
        inside.set()
        await release.wait()

    @app.job(every(minutes=1), name=PAIR[1], overlap="skip")
    async def second(db, now):  # type: ignore[no-untyped-def]
        ran.append(PAIR[1])

    holder = asyncio.create_task(app.run(PAIR[0], NOW))
    await asyncio.wait_for(inside.wait(), 10)
    other = await app.run(PAIR[1], NOW)  # a different job: nothing to do with the first
    release.set()
    assert (await holder).status is RunStatus.RAN
    assert other.status is RunStatus.RAN, other
    assert sorted(ran) == sorted(PAIR)
    await app.aclose()


def test_a_job_lock_collision_is_refused_at_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    def narrow(job: str) -> tuple[int, int]:  # the old 32-bit key: the pair collides
        digest = hashlib.blake2b(f"{job}\0".encode(), digest_size=4).digest()
        return (0, int.from_bytes(digest, "big", signed=True))

    monkeypatch.setattr(locks, "job_lock_key", narrow)
    app = Oncely("sqlite://")
    app.job(every(minutes=1), name=PAIR[0])(lambda db, now: None)
    with pytest.raises(ConfigError) as raised:
        app.job(every(minutes=1), name=PAIR[1])(lambda db, now: None)
    assert PAIR[0] in str(raised.value) and PAIR[1] in str(raised.value)
    assert [job.name for job in app.registry] == [PAIR[0]]


def test_slot_and_job_keys_fill_64_bits_and_differ() -> None:
    keys = {locks.slot_lock_key(PAIR[0], ""), locks.job_lock_key(PAIR[0])}
    keys |= {locks.job_lock_key(PAIR[1]), locks.slot_lock_key(PAIR[1], "")}
    assert len(keys) == 4
    hi, lo = locks.slot_lock_key("a", "b")
    assert -(2**31) <= hi < 2**31 and -(2**31) <= lo < 2**31
