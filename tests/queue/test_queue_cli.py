"""`oncely enqueue`, `oncely tasks`, `oncely tasks retry|discard`, `oncely prune` in real
processes: exit codes 0 / 2, clear errors, and nothing changed by bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.support import ROOT, run_cli

APP = "tests.apps.queue_app:app"


@pytest.fixture
def env(db_url: str, sync_engine: sa.Engine) -> dict[str, str]:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_APP": APP}
    assert run_cli("migrate", cwd=ROOT, env=env).returncode == 0
    return env


def count(engine: sa.Engine, where: str = "true") -> int:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(f"SELECT count(*) FROM oncely_tasks WHERE {where}")
        ).scalar_one()


def test_enqueue_and_list(env: dict[str, str], sync_engine: sa.Engine) -> None:
    done = run_cli("enqueue", "record", "--json", '{"n": 5}', cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("enqueued record id ")
    listed = run_cli("tasks", "--json", cwd=ROOT, env=env)
    (task,) = json.loads(listed.stdout)
    assert (task["task"], task["args"], task["state"], task["attempt"]) == (
        "record",
        {"n": 5},
        "available",
        0,
    )
    table = run_cli("tasks", "--state", "available", "--task", "record", cwd=ROOT, env=env)
    assert table.stdout.splitlines()[0].split()[:4] == ["ID", "TASK", "STATE", "ATTEMPT"]
    assert "record" in table.stdout.splitlines()[1]
    none = run_cli("tasks", "--state", "dead", "--json", cwd=ROOT, env=env)
    assert json.loads(none.stdout) == []


def test_duplicates_are_observable_enqueue_same_key(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    args = ("enqueue", "record", "--json", '{"n": 1}', "--idempotency-key", "k1")
    first = run_cli(*args, cwd=ROOT, env=env)
    second = run_cli(*args, cwd=ROOT, env=env)
    assert first.returncode == second.returncode == 0
    assert second.stdout.startswith("duplicate record id ")
    assert "task.duplicate: already enqueued, skipping" in second.stderr
    assert "idempotency_key=k1" in second.stderr
    assert count(sync_engine) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("enqueue", "nope", "--json", "{}"), "unknown task 'nope'"),
        (("enqueue", "record", "--json", "{n: 1}"), "--json is not valid JSON"),
        (("enqueue", "record", "--json", "[1]"), "must be an object"),
        (("enqueue", "record", "--json", '{"m": 1}'), "cannot take these arguments"),
        (("enqueue", "record", "--json", '{"n": 1}', "--delay", "soon"), "bad --delay"),
        (("tasks", "retry", "999"), "no task with id 999"),
        (("tasks", "discard", "999"), "no task with id 999"),
        (("prune", "--older-than", "forever"), "bad --older-than"),
        (("prune", "--older-than", "5m"), "under 1h"),
    ],
)
def test_bad_input_gets_a_clear_error_cli(
    env: dict[str, str], sync_engine: sa.Engine, args: tuple[str, ...], message: str
) -> None:
    proc = run_cli(*args, cwd=ROOT, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert count(sync_engine) == 0


def test_bad_input_gets_a_clear_error_schema_missing(db_url: str, tmp_path: Path) -> None:
    env = {"ONCELY_DATABASE_URL": db_url, "ONCELY_APP": APP}
    proc = run_cli("enqueue", "record", "--json", '{"n": 1}', cwd=ROOT, env=env)
    assert proc.returncode == 2 and "oncely migrate" in proc.stderr


def test_retry_discard_and_prune(env: dict[str, str], sync_engine: sa.Engine) -> None:
    for n in range(3):
        assert (
            run_cli("enqueue", "record", "--json", f'{{"n": {n}}}', cwd=ROOT, env=env).returncode
            == 0
        )
    ids = [t["id"] for t in json.loads(run_cli("tasks", "--json", cwd=ROOT, env=env).stdout)]
    newest, middle, oldest = ids
    with sync_engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE oncely_tasks SET state = 'dead', attempt = 25 WHERE id = :i"),
            {"i": oldest},
        )
        conn.execute(
            sa.text("UPDATE oncely_tasks SET state = 'succeeded' WHERE id = :i"), {"i": middle}
        )
    retried = run_cli("tasks", "retry", str(oldest), cwd=ROOT, env=env)
    assert retried.returncode == 0 and "available now" in retried.stdout
    assert count(sync_engine, f"id = {oldest} AND state = 'available' AND attempt = 0") == 1
    refused = run_cli("tasks", "retry", str(middle), cwd=ROOT, env=env)
    assert refused.returncode == 2 and "is succeeded" in refused.stderr
    discarded = run_cli("tasks", "discard", str(newest), cwd=ROOT, env=env)
    assert discarded.returncode == 0
    assert count(sync_engine, f"id = {newest} AND state = 'discarded'") == 1
    # Prune: only finished tasks older than the cutoff go (here: backdate one of them).
    with sync_engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE oncely_tasks SET finished_at = :t WHERE id = :i"),
            {"t": "2000-01-01 00:00:00+00:00", "i": middle},
        )
    pruned = run_cli("prune", "--older-than", "30d", cwd=ROOT, env=env)
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith("pruned 1 finished tasks and 0 claims")
    assert count(sync_engine) == 2


def test_tasks_show_prints_every_failed_attempt(
    env: dict[str, str], sync_engine: sa.Engine
) -> None:
    """`oncely tasks show ID` ends with each failed attempt's error and traceback, newest
    first, credentials masked; `--json` has them as a list; `oncely prune` takes them along."""
    enqueued = run_cli("enqueue", "record", "--json", '{"n": 1}', cwd=ROOT, env=env)
    assert enqueued.returncode == 0, enqueued.stderr
    (task,) = json.loads(run_cli("tasks", "--json", cwd=ROOT, env=env).stdout)
    errors = [
        (1, "Transient: first\nTraceback (most recent call last):\n  File a.py", "w-1"),
        (2, "Transient: no postgresql://bo:s3cret@db/x\nTraceback (most recent call last):", "w-2"),
    ]
    with sync_engine.begin() as conn:
        for attempt, error, by in errors:
            conn.execute(
                sa.text(
                    "INSERT INTO oncely_task_errors (task_id, attempt, error, by, at) "
                    "VALUES (:t, :a, :e, :b, '2026-01-01 00:00:00+00:00')"
                ),
                {"t": task["id"], "a": attempt, "e": error, "b": by},
            )
        conn.execute(
            sa.text(
                "UPDATE oncely_tasks SET state = 'dead', attempt = 2, error = :e, "
                "finished_at = '2000-01-01 00:00:00+00:00' WHERE id = :i"
            ),
            {"e": errors[1][1], "i": task["id"]},
        )
    shown = run_cli("tasks", "show", str(task["id"]), cwd=ROOT, env=env)
    assert shown.returncode == 0, shown.stderr
    history = shown.stdout.split("failed attempts (2, newest first):\n", 1)[1]
    assert history.index("attempt 2 at 2026-01-01T00:00:00+00:00 by w-2:") < history.index(
        "attempt 1 at 2026-01-01T00:00:00+00:00 by w-1:"
    )
    assert "    Transient: first\n    Traceback (most recent call last):\n" in history
    assert "postgresql://bo:***@db/x" in history and "s3cret" not in shown.stdout
    data = json.loads(run_cli("tasks", "show", str(task["id"]), "--json", cwd=ROOT, env=env).stdout)
    assert [(e["attempt"], e["by"]) for e in data["attempt_errors"]] == [(2, "w-2"), (1, "w-1")]
    assert data["attempt_errors"][1]["error"] == errors[0][1]
    assert data["attempt_errors_more"] is False

    pruned = run_cli("prune", "--older-than", "30d", cwd=ROOT, env=env)
    assert pruned.returncode == 0, pruned.stderr
    with sync_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM oncely_task_errors")).scalar() == 0
