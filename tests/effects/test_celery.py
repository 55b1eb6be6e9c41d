"""A real Celery worker (Redis broker, acks_late) SIGKILLed after the effect committed but
before the ack: the redelivered message runs `app.once` again and causes no second effect."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.apps import shop
from tests.support import IN_CI, ROOT

from oncely import Oncely
from oncely.testing import FakeProvider

celery_shop = pytest.importorskip("tests.apps.celery_shop", reason="celery is not installed")


@pytest.fixture
def broker() -> Iterator[str]:
    import redis

    client = redis.Redis.from_url(celery_shop.REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        if IN_CI:
            pytest.fail(f"Redis is not reachable at {celery_shop.REDIS_URL}: {exc}")
        pytest.skip(f"Redis is not reachable at {celery_shop.REDIS_URL}: {exc}")
    queue = f"oncely-test-{uuid.uuid4().hex[:8]}"
    yield queue
    client.delete(queue)
    client.close()


def _worker(queue: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "tests.apps.celery_shop", "worker",
                "--pool=solo", "--concurrency=1", "-Q", queue, "--loglevel=INFO",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
            ],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def _wait_for(path_glob: str, directory: Path, proc: subprocess.Popen[bytes], log: Path) -> Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = sorted(directory.glob(path_glob))
        if found:
            return found[0]
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise AssertionError(f"no {path_glob} in time; worker log:\n{log.read_text()[-3000:]}")


@pytest.mark.parametrize("safe", [True, False], ids=["app.once", "no-claim"])
def test_celery_redelivery_after_sigkill_before_ack_has_one_effect(
    db_url: str,
    sync_engine: sa.Engine,
    fake_provider: FakeProvider,
    broker: str,
    tmp_path: Path,
    safe: bool,
) -> None:
    """With app.once: one effect. The same scenario without it: two (the test can fail)."""
    import asyncio

    async def prepare() -> None:
        app = Oncely(db_url)
        await app.migrate()
        await app.aclose()

    asyncio.run(prepare())
    with sync_engine.begin() as conn:
        conn.exec_driver_sql(shop.SHOP_TABLES)
    signals = tmp_path / "signals"
    signals.mkdir()
    env = {
        "ONCELY_DATABASE_URL": db_url,
        "ONCELY_FAKE_PROVIDER": str(fake_provider.path),
        "ONCELY_TEST_SIGNALS": str(signals),
    }
    celery_shop.charge.apply_async((42, safe), queue=broker)

    first_log = tmp_path / "worker1.log"
    first = _worker(broker, env, first_log)
    try:
        _wait_for("committed", signals, first, first_log)
        assert shop.payments(sync_engine) == 1  # the effect committed ...
        first.send_signal(signal.SIGKILL)  # ... and the worker dies before the ack
        assert first.wait(timeout=30) == -signal.SIGKILL
    finally:
        first.kill()
    assert [p.name.rsplit("-", 1)[1] for p in signals.glob("delivered-*")] == ["ran"]

    (signals / "release").touch()
    second_log = tmp_path / "worker2.log"
    second = _worker(broker, env, second_log)
    try:
        redelivered = _wait_for(f"delivered-{second.pid}-*", signals, second, second_log)
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(timeout=30)
        except subprocess.TimeoutExpired:
            second.kill()
    log = second_log.read_text()
    if not safe:
        assert redelivered.name.endswith("-ran")
        assert shop.payments(sync_engine) == 2  # charged and recorded twice
        with pytest.raises(AssertionError, match="expected 1 applied effect"):
            fake_provider.assert_applied(1)
        return
    assert redelivered.name.endswith("-skipped")
    assert "effect.skipped: already processed, skipping" in log and "key=charge:42" in log
    assert shop.payments(sync_engine) == 1
    fake_provider.assert_applied(1)
    assert fake_provider.calls == 1  # the duplicate never reached the provider
