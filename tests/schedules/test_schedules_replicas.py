"""Schedules kept as data on three real worker processes: a change reaches every replica
within the poll bound without a restart, each slot is claimed once and its task enqueued
once, and a replica SIGKILLed between its slot's work and its commit leaves nothing behind:
another replica runs the slot, once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import _reset_postgres
from tests.schedules.conftest import APP, fresh_app, migrate, rows
from tests.support import ROOT, wait_until

POLL = 1.0
"""The workers' default schedule_poll: how soon a change reaches them."""
BOUND = POLL + 2.0
"""What the tests allow between a slot's time and its claim: the poll, plus room for a
shared, loaded machine (the measured latencies are printed)."""


@dataclass
class Fleet:
    db_url: str
    tmp: Path
    procs: list[subprocess.Popen[str]]

    def start(self, n: int, **extra: str) -> list[subprocess.Popen[str]]:
        env = {**os.environ, "ONCELY_DATABASE_URL": self.db_url, **extra}
        started = []
        for i in range(n):
            log = (self.tmp / f"worker-{len(self.procs)}-{i}.log").open("w")
            proc = subprocess.Popen(
                [sys.executable, "-m", "oncely", "--app", f"{APP}:app", "worker"],
                cwd=ROOT,
                env=env,
                text=True,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            started.append(proc)
        self.procs += started
        return started

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """`app.schedules.<name>_sync(...)` from the test's own process."""
        app = fresh_app(self.db_url)
        return getattr(app.schedules, f"{name}_sync")(*args, **kwargs)

    def db_now(self) -> datetime:
        if self.db_url.startswith("postgres"):
            value: datetime = rows(self.db_url, "SELECT clock_timestamp()")[0][0]
            return value
        return datetime.now(timezone.utc)

    def claims(self, job: str) -> list[tuple[datetime, datetime, str]]:
        """(slot, claimed_at, key) of each claim of `job`, oldest first."""
        found = rows(
            self.db_url,
            "SELECT scheduled_for, claimed_at, key FROM oncely_runs WHERE job = :j "
            "ORDER BY scheduled_for",
            j=job,
        )
        return [(_aware(s), _aware(c), k) for s, c, k in found]

    def wait_db_time(self, at: datetime) -> None:
        wait_until(lambda: self.db_now() >= at, f"the database's clock to reach {at}")


def _aware(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


@pytest.fixture
def fleet(db_url: str, tmp_path: Path) -> Iterator[Fleet]:
    migrate(db_url)
    f = Fleet(db_url, tmp_path, [])
    try:
        yield f
    finally:
        for proc in f.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in f.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _workers(f: Fleet) -> int:
    return len(rows(f.db_url, "SELECT id FROM oncely_workers"))


def _one_task_per_claim(f: Fleet, job: str) -> None:
    # One statement, one snapshot: workers may commit a slot (its claim and its task) meanwhile.
    found = rows(
        f.db_url,
        "SELECT 'claim', key FROM oncely_runs WHERE job = :j UNION ALL "
        "SELECT 'task', idempotency_key FROM oncely_tasks WHERE idempotency_key LIKE :p",
        j=job,
        p=f"{job}:%",
    )
    keys = [k for what, k in found if what == "claim"]
    assert len(keys) == len(set(keys))
    tasks = [k for what, k in found if what == "task"]
    assert sorted(tasks) == sorted(f"{job}:{k}" for k in keys)


def _on_grid(slot: datetime, seconds: int) -> bool:
    return int(slot.timestamp()) % seconds == 0 and slot.microsecond == 0


@pytest.mark.timeout(240)  # three worker processes through add, change, pause, resume, remove
def test_changes_reach_three_running_workers_within_the_poll_bound(fleet: Fleet) -> None:
    fleet.start(3)
    wait_until(lambda: _workers(fleet) == 3, "three workers")
    job = "schedule:acme"

    added = fleet.call("add", "acme", every="2s", task="digest", args={"tenant": "acme"})
    wait_until(lambda: len(fleet.claims(job)) >= 2, "two slots of the new schedule")
    first = fleet.claims(job)[0]
    assert first[0] == added.next_slot  # the first slot after the add, not an older one

    changed = fleet.call("update", "acme", every="3s")
    wait_until(
        lambda: any(s > changed.changed_at for s, _c, _k in fleet.claims(job)),
        "a slot of the changed schedule",
    )
    after_change = [s for s, _c, _k in fleet.claims(job) if s > changed.changed_at]
    before_change = [s for s, _c, _k in fleet.claims(job) if s <= changed.changed_at]
    assert all(_on_grid(s, 3) for s in after_change), after_change
    assert all(_on_grid(s, 2) for s in before_change), before_change

    paused = fleet.call("pause", "acme", reason="customer left")
    fleet.wait_db_time(paused.changed_at + timedelta(seconds=3 * 3 + BOUND))
    assert [s for s, _c, _k in fleet.claims(job) if s >= paused.changed_at] == []

    resumed = fleet.call("resume", "acme")
    wait_until(
        lambda: any(s > resumed.changed_at for s, _c, _k in fleet.claims(job)),
        "a slot after the resume",
    )

    fleet.call("remove", "acme")
    removed_at = fleet.db_now()
    fleet.wait_db_time(removed_at + timedelta(seconds=3 * 3 + BOUND))
    assert [s for s, _c, _k in fleet.claims(job) if s > removed_at + timedelta(seconds=BOUND)] == []

    latencies = [(c - s).total_seconds() for s, c, _k in fleet.claims(job)]
    print(f"fire latency over {len(latencies)} slots: max {max(latencies):.3f} s")
    assert max(latencies) <= BOUND, latencies
    _one_task_per_claim(fleet, job)
    claims = len(fleet.claims(job))
    wait_until(
        lambda: len(rows(fleet.db_url, "SELECT * FROM effects WHERE arg = 'acme'")) == claims,
        "every slot's task to run",
    )


@pytest.mark.postgres
@pytest.mark.timeout(240)  # a worker killed mid-slot, two more finish the run
def test_a_replica_killed_before_its_slot_commits_leaves_the_slot_to_another_once(
    postgres_database: str, tmp_path: Path
) -> None:
    _reset_postgres(postgres_database)
    gen = fleet.__wrapped__(postgres_database, tmp_path)  # type: ignore[attr-defined]
    f = next(gen)
    try:
        hold = tmp_path / "hold"
        (killed,) = f.start(1, ONCELY_TEST_SCHED_HOLD=str(hold))
        wait_until(lambda: _workers(f) == 1, "the first worker")
        # catch_up="all": the killed replica's slot is run although later ones came due while
        # it held it ("latest" would run only the newest, and report the held one missed).
        f.call("add", "acme", every="2s", task="digest", args={"tenant": "acme"}, catch_up="all")
        started = Path(f"{hold}.started")
        wait_until(started.exists, "the first worker to stop before its slot's commit")
        job, key = started.read_text().split()
        f.start(2)
        wait_until(lambda: _workers(f) == 3, "two more workers")
        assert f.claims(job) == []  # the held slot's claim is not committed
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        wait_until(lambda: key in [k for _s, _c, k in f.claims(job)], "the slot run by another")
        wait_until(lambda: len(f.claims(job)) >= 3, "more slots")
        _one_task_per_claim(f, job)
        claims = f.claims(job)
        assert claims[0][2] == key
        wait_until(
            lambda: len(rows(f.db_url, "SELECT * FROM effects")) >= len(claims),
            "the slots' tasks to run",
        )
        # One statement, one snapshot: the workers go on running the next slots' tasks.
        ((effects, succeeded),) = rows(
            f.db_url,
            "SELECT (SELECT count(*) FROM effects), "
            "(SELECT count(*) FROM oncely_tasks WHERE state = 'succeeded')",
        )
        assert effects == succeeded
    finally:
        hold.touch()
        with __import__("contextlib").suppress(StopIteration):
            next(gen)
