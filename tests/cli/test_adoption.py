"""What a new team asked of the CLI: replica names, zones in `history`, tasks in `list`,
`next` for every job, `run TASK`, `run --wait`, quiet replica races, no stale LAST ERROR."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.apps.adoption import create_tables
from tests.support import ROOT, run_cli, start_cli, wait_until

APP = "tests.apps.adoption:app"
FRIDAY = "2026-11-27T18:01:00-06:00"


@pytest.fixture
def env(db_url: str, sync_engine: sa.Engine, tmp_path: Path) -> dict[str, str]:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_APP": APP, "ONCELY_TEST_SIGNALS": str(tmp_path)}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    create_tables(sync_engine)
    return env


def claims(engine: sa.Engine) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT job, key, claimed_by FROM oncely_runs ORDER BY job"))
        return [tuple(r) for r in rows]  # type: ignore[misc]


def test_replica_name_comes_from_oncely_replica(env: dict[str, str], sync_engine: sa.Engine):
    named = run_cli("run", "tick", cwd=ROOT, env={**env, "ONCELY_REPLICA": "web-2"})
    assert named.returncode == 0, named.stderr
    assert [c[2] for c in claims(sync_engine)] == ["web-2"]
    unnamed = run_cli("--log-format", "json", "run", "tick", cwd=ROOT, env=env)
    assert unnamed.returncode == 0
    # A second run of the same second is skipped or ran the next one; either way host:pid.
    by = {c[2] for c in claims(sync_engine)} - {"web-2"}
    assert all(b.count(":") == 1 for b in by)


@pytest.fixture
def released(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    (tmp_path / "release").touch()
    return env


def test_history_shows_the_slot_in_the_jobs_zone(released: dict[str, str]) -> None:
    ran = run_cli("run", "close", "--now", FRIDAY, cwd=ROOT, env=released)
    assert ran.returncode == 0, ran.stderr
    table = run_cli("history", cwd=ROOT, env=released).stdout.splitlines()
    assert table[0].split()[:3] == ["JOB", "KEY", "SLOT"]
    assert table[1].split()[2] == "2026-11-27T18:00:00-06:00"
    (entry,) = json.loads(run_cli("history", "--json", cwd=ROOT, env=released).stdout)
    assert entry["slot"] == "2026-11-27T18:00:00-06:00"


def test_list_shows_tasks_with_queue_retry_and_counts(env: dict[str, str]) -> None:
    for _ in range(2):
        assert run_cli("enqueue", "noop", cwd=ROOT, env=env).returncode == 0
    assert (
        run_cli("enqueue", "send_once_flaky", "--json", '{"n": 1}', cwd=ROOT, env=env).returncode
        == 0
    )
    out = run_cli("list", cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("TASK "))
    assert lines[start].split() == ["TASK", "QUEUE", "RETRY", "TASKS", "BY", "STATE"]
    rows = {line.split()[0]: line for line in lines[start + 1 :]}
    assert "available 2" in rows["noop"] and " default " in rows["noop"]
    assert " mail " in rows["send_once_flaky"]
    assert "3 attempts, fixed from 0.05 s" in rows["send_once_flaky"]
    listed = json.loads(run_cli("list", "--json", cwd=ROOT, env=env).stdout)
    tasks = {t["name"]: t for t in listed if t["kind"] == "task"}
    assert tasks["noop"]["counts"] == {"available": 2}
    assert tasks["noop"]["retry"].startswith("25 attempts")
    assert {j["name"] for j in listed if j["kind"] == "job"} == {"close", "tick"}


def test_next_without_a_job_lists_every_job(env: dict[str, str]) -> None:
    after = "2026-11-27T18:00:00-06:00"
    out = run_cli("next", "--after", after, "-n", "2", cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert rows[0] == ["JOB", "NEXT"]
    assert [r[0] for r in rows[1:]] == ["close", "close", "tick", "tick"]
    assert rows[1][1] == "2026-12-04T18:00:00-06:00"
    assert rows[3][1] == "2026-11-28T00:00:01+00:00"
    data = json.loads(run_cli("next", "--after", after, "--json", cwd=ROOT, env=env).stdout)
    assert [d["job"] for d in data] == ["close", "tick"]


def test_run_of_a_task_says_it_is_a_task(env: dict[str, str], sync_engine: sa.Engine) -> None:
    for command in (["run", "noop"], ["next", "noop"]):
        out = run_cli(*command, cwd=ROOT, env=env)
        assert out.returncode == 2
        assert "'noop' is a task, not a scheduled job" in out.stderr
        assert "oncely enqueue noop" in out.stderr
        assert "Traceback" not in out.stderr
    assert claims(sync_engine) == []


def test_a_task_that_succeeded_shows_no_last_error(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    assert (
        run_cli("enqueue", "send_once_flaky", "--json", '{"n": 7}', cwd=ROOT, env=env).returncode
        == 0
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "oncely", "worker", "--jobs", "close"],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def succeeded() -> bool:
            with sync_engine.connect() as conn:
                q = "SELECT count(*) FROM oncely_tasks WHERE state = 'succeeded' AND attempt = 2"
                return conn.execute(sa.text(q)).scalar_one() == 1

        wait_until(succeeded, "the task to succeed on its second attempt")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)
    table = run_cli("tasks", cwd=ROOT, env=env).stdout.splitlines()
    assert table[0].split()[-2:] == ["LAST", "ERROR"]
    assert "succeeded" in table[1] and "Flaky" not in table[1]
    assert table[1].split()[-1] == "-"
    (rec,) = json.loads(run_cli("tasks", "--json", cwd=ROOT, env=env).stdout)
    assert rec["error"] is None
    assert rec["earlier_error"].startswith("Flaky: smtp timeout on 7")  # kept, as history


def start_holder(env: dict[str, str], tmp_path: Path) -> subprocess.Popen[str]:
    holder = start_cli("run", "close", "--now", FRIDAY, env=env)
    wait_until(lambda: (tmp_path / f"started-{holder.pid}").exists(), "the holder to start")
    return holder


def start_waiter(env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    return start_cli("run", "close", "--now", FRIDAY, "--wait", "60", *extra, env=env)


def closes(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM closes")).scalar_one())


@pytest.mark.parametrize("holder_outcome", ["release", "fail"])
def test_run_wait_exits_with_the_holders_outcome(
    env: dict[str, str], sync_engine: sa.Engine, tmp_path: Path, holder_outcome: str
) -> None:
    holder = start_holder(env, tmp_path)
    waiter = start_waiter(env)
    try:
        # The waiter found the slot busy and is waiting (not exiting 0 as a plain run does).
        assert waiter.stderr is not None
        seen = ""
        while "another process is running this slot" not in seen:  # found it busy ...
            line = waiter.stderr.readline()
            assert line, seen
            seen += line
        assert waiter.poll() is None  # ... and waits, where a plain run exits 0
        (tmp_path / holder_outcome).touch()
        out, err = waiter.communicate(timeout=60)
        err = seen + err
    finally:
        holder.kill() if holder.poll() is None else None
        holder.communicate(timeout=60)
    if holder_outcome == "release":
        assert waiter.returncode == 0, err
        assert "ran elsewhere (claimed by " in out
        assert closes(sync_engine) == 1
    else:
        assert waiter.returncode == 1, out + err
        assert "failed elsewhere" in err
        assert closes(sync_engine) == 0 and claims(sync_engine) == []  # nothing landed
        (tmp_path / "fail").unlink()
        (tmp_path / "release").touch()
        # The failure freed the slot: the caller's retry (a later `oncely run`) runs it, once.
        retry = run_cli("run", "close", "--now", FRIDAY, "--wait", "5", cwd=ROOT, env=env)
        assert retry.returncode == 0 and retry.stdout.startswith("ran close"), retry.stderr
        assert closes(sync_engine) == 1
        again = run_cli("run", "close", "--now", FRIDAY, cwd=ROOT, env=env)
        assert again.returncode == 0 and again.stdout.startswith("skipped close")
        assert closes(sync_engine) == 1


def test_run_wait_on_a_free_slot_just_runs(released: dict[str, str], sync_engine: sa.Engine):
    out = run_cli("run", "close", "--now", FRIDAY, "--wait", "30s", cwd=ROOT, env=released)
    assert out.returncode == 0 and out.stdout.startswith("ran close"), out.stderr
    assert closes(sync_engine) == 1


@pytest.mark.parametrize("value", ["soon", "0", "-5", "2d", "nan", ""])
def test_bad_wait_exits_2_and_changes_nothing(
    released: dict[str, str], sync_engine: sa.Engine, value: str
) -> None:
    out = run_cli("run", "close", "--now", FRIDAY, "--wait", value, cwd=ROOT, env=released)
    assert out.returncode == 2, out.stderr
    assert f"bad --wait {value!r}" in out.stderr and "Traceback" not in out.stderr
    assert claims(sync_engine) == [] and closes(sync_engine) == 0


def _levels(stderr: str, event: str) -> set[str]:
    return {json.loads(line)["level"] for line in stderr.splitlines() if f'"{event}"' in line}


def test_replicas_racing_log_skipped_and_busy_at_debug(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    """Two workers race for every second's slot: the loser's run.skipped / run.busy are DEBUG
    (observers still count them); a duplicate `oncely run` stays INFO."""
    base = [sys.executable, "-m", "oncely", "--log-level", "debug", "--log-format", "json"]
    workers = [
        subprocess.Popen(
            [*base, "worker", "--jobs", "tick", "--concurrency", "0"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:

        def ticks() -> int:
            with sync_engine.connect() as conn:
                q = "SELECT count(*) FROM oncely_runs WHERE job = 'tick'"
                return int(conn.execute(sa.text(q)).scalar_one())

        wait_until(lambda: ticks() >= 4, "four slots of tick")
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
    stderr = "".join(w.communicate(timeout=60)[1] for w in workers)
    lost = _levels(stderr, "run.skipped") | _levels(stderr, "run.busy")
    assert lost == {"DEBUG"}, stderr[-3000:]
    assert _levels(stderr, "run.ran") == {"INFO"}

    (Path(env["ONCELY_TEST_SIGNALS"]) / "release").touch()
    assert run_cli("run", "close", "--now", FRIDAY, cwd=ROOT, env=env).returncode == 0
    again = run_cli("--log-format", "json", "run", "close", "--now", FRIDAY, cwd=ROOT, env=env)
    assert _levels(again.stderr, "run.skipped") == {"INFO"}  # a duplicate trigger stays INFO
    quiet = run_cli(
        "--log-format", "json", "--event-level", "run.skipped=warning",
        "run", "close", "--now", FRIDAY, cwd=ROOT, env=env,
    )  # fmt: skip
    assert _levels(quiet.stderr, "run.skipped") == {"WARNING"}


@pytest.mark.parametrize("spec", ["run.skipped", "run.skipped=loud", "=info"])
def test_bad_event_level_exits_2(env: dict[str, str], spec: str) -> None:
    out = run_cli("--event-level", spec, "list", cwd=ROOT, env=env)
    assert out.returncode == 2 and f"bad --event-level {spec!r}" in out.stderr
