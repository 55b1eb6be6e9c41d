"""A slot's fate across a fleet: three real `oncely worker` processes on Postgres, and a slot
whose attempt fails or times out under a one-attempt policy, or is cancelled, is attempted once
fleet-wide (given up), and a failing slot is attempted exactly as often as the job's retry policy
says, counted across the replicas (guarantee 10).

Each call of the job leaves a file (tests/apps/fleet_fate.py), outside its transaction: the
tests count calls per slot. A slot is settled once the job's next-but-one slot has begun (the
other replicas, which found it busy, have tried it again by then: busy slots are retried
within a second)."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from tests.conftest import _reset_postgres, _sync_url
from tests.support import ROOT, run_cli, start_cli, wait_until

from oncely.cli import cli

pytestmark = pytest.mark.postgres

APP = "tests.apps.fleet_fate:app"


class Fleet:
    """Three workers of one job, their signal directory and logs."""

    def __init__(self, url: str, tmp: Path, job: str) -> None:
        self.url, self.tmp, self.job = url, tmp, job
        self.env = {
            **os.environ,
            "ONCELY_DATABASE_URL": url,
            "ONCELY_APP": APP,
            "ONCELY_TEST_SIGNALS": str(tmp),
        }
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, n: int = 3) -> None:
        for i in range(n):
            log = self.tmp / f"worker-{i}.log"
            self.procs.append(start_cli("worker", "--jobs", self.job, env=self.env, log=log))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:  # a graceful stop waits for a running slot's grace: the test has its answer
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def calls(self) -> dict[str, list[str]]:
        """The job's calls by slot (HHMMSS), oldest slot first: each call's pid."""
        found: dict[str, list[str]] = collections.defaultdict(list)
        for path in self.tmp.glob(f"call-{self.job}-*"):
            _, _, key, pid, _ = path.name.split("-")
            found[key].append(pid)
        return dict(sorted(found.items()))

    def settled(self, n: int) -> dict[str, list[str]]:
        """The calls of the first `n` slots once `n + 1` slots have begun (deadline 60 s)."""
        wait_until(lambda: len(self.calls()) > n, f"{n + 1} slots of {self.job}", log=self.log)
        return dict(list(self.calls().items())[:n])

    @property
    def log(self) -> Path:
        return self.tmp / "worker-0.log"

    def cancel(self) -> tuple[int, str]:
        """`oncely cancel JOB --json` in this process (no interpreter start: within the
        attempt's first second); its exit code and output."""
        return cancel(self.url, self.job)

    def logs(self) -> str:
        return "".join(p.read_text() for p in sorted(self.tmp.glob("worker-*.log")))


@pytest.fixture
def fleet_url(postgres_database: str) -> str:
    _reset_postgres(postgres_database)
    env = {"ONCELY_DATABASE_URL": postgres_database, "ONCELY_APP": APP}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    return postgres_database


@pytest.fixture
def fleet(fleet_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    one = Fleet(fleet_url, tmp_path, request.param)
    one.start()
    try:
        yield one
    finally:
        one.stop()


def cancel(url: str, job: str) -> tuple[int, str]:
    sys.modules.pop(APP.split(":")[0], None)  # imported anew, as a new process would
    args = ["--app", APP, "--database-url", url, "cancel", job, "--json"]
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.stdout + result.stderr


def attempt_rows(
    url: str, job: str, *, started: bool = False
) -> list[tuple[str, str, bool | None, bool]]:
    """(key, outcome, final, has retry_at) of the job's ended attempt records (`started`:
    of those still running), oldest first."""
    ended = "IS NULL" if started else "IS NOT NULL"
    engine = sa.create_engine(_sync_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT key, outcome, final, retry_at IS NOT NULL FROM oncely_attempts "
                    f"WHERE job = :j AND outcome {ended} ORDER BY id"
                ),
                {"j": job},
            ).all()
    finally:
        engine.dispose()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("fleet", "outcome"), [("boom", "failed"), ("late", "timeout")], indirect=["fleet"]
)
def test_a_failed_or_timed_out_slot_has_one_attempt_across_three_workers(
    fleet: Fleet, outcome: str
) -> None:
    settled = fleet.settled(3)
    assert {key: len(pids) for key, pids in settled.items()} == {key: 1 for key in settled}, (
        settled,
        fleet.logs()[-4000:],
    )
    rows = [
        r for r in attempt_rows(fleet.url, fleet.job) if r[0][11:19].replace(":", "") in settled
    ]
    assert [(r[1], r[2], r[3]) for r in rows] == [(outcome, True, False)] * 3, rows
    assert "run.given_up" in fleet.logs()  # the other replicas saw the slot given up


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fleet", ["flaky"], indirect=True)
def test_a_retry_policy_of_two_attempts_runs_each_slot_exactly_twice_across_the_fleet(
    fleet: Fleet,
) -> None:
    settled = fleet.settled(2)
    assert {key: len(pids) for key, pids in settled.items()} == {key: 2 for key in settled}, (
        settled,
        fleet.logs()[-4000:],
    )
    rows = [r for r in attempt_rows(fleet.url, "flaky") if r[0][11:19].replace(":", "") in settled]
    # Per slot: the first attempt is to be retried (retry_at), the second is final.
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("failed", None, True),
        ("failed", True, False),
    ] * 2, rows


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fleet", ["stuck"], indirect=True)
def test_a_cancelled_slot_is_not_started_again_by_another_worker(fleet: Fleet) -> None:
    wait_until(lambda: fleet.calls(), "stuck to start", log=fleet.log)
    code, out = fleet.cancel()  # in the attempt's first second
    assert code == 0, out
    assert '"cancel requested"' in out
    first = next(iter(fleet.calls()))
    # The next slot starts (the cancelled one ended), or another replica starts it again.
    wait_until(
        lambda: len(fleet.calls()) > 1 or len(fleet.calls()[first]) > 1,
        "the next slot to start",
        log=fleet.log,
    )
    assert fleet.calls()[first] and len(fleet.calls()[first]) == 1, fleet.calls()
    rows = [r for r in attempt_rows(fleet.url, "stuck") if r[0][11:19].replace(":", "") == first]
    assert [(r[1], r[2]) for r in rows] == [("cancelled", True)], rows


def test_a_cancel_in_the_attempt_s_first_second_reaches_it(fleet_url: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "ONCELY_DATABASE_URL": fleet_url,
        "ONCELY_APP": APP,
        "ONCELY_TEST_SIGNALS": str(tmp_path),
    }
    holder = start_cli("run", "stuck", "--json", env=env)
    try:
        wait_until(lambda: list(tmp_path.glob("call-stuck-*")), "stuck to start")
        # Its start is not recorded yet (that comes after 1 s): the case the cancel waits for.
        assert attempt_rows(fleet_url, "stuck", started=True) == []
        code, asked = cancel(fleet_url, "stuck")
        assert code == 0, asked
        out, err = holder.communicate(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode == 1, err
    assert json.loads(out)["status"] == "cancelled"
