"""`oncely release` of a running slot is refused the same way on both databases, and
`oncely rename OLD NEW` carries a renamed job's ledger so the new name does not re-run it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from tests.support import RELIAB_APP as APP
from tests.support import engine_for, one_clear_line, snapshot, start_cli

from oncely.cli import cli

NOW = "2026-12-01T10:00:00Z"
KEY = "2026-12-01T10:00:00Z"
RENAMED = "tests.apps.reliab_app_renamed:app"


def invoke(db_url: str, *args: str) -> Result:
    sys.modules.pop(APP.split(":")[0], None)
    return CliRunner().invoke(cli, ["--app", APP, "--database-url", db_url, *args])


def claims(db_url: str) -> list[tuple[str, str]]:
    engine = engine_for(db_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT job, key FROM oncely_runs ORDER BY job, key")).all()
    engine.dispose()
    return [(r[0], r[1]) for r in rows]


def wait_for(path: Path, proc: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_release_of_a_running_slot_is_refused(db_url: str, tmp_path: Path) -> None:
    assert invoke(db_url, "migrate").exit_code == 0
    signal = tmp_path / "release-me"
    env = {**os.environ, "ONCELY_APP": APP, "ONCELY_DATABASE_URL": db_url}
    env["ONCELY_TEST_HOLD"] = str(signal)
    holder = start_cli("run", "hold", "--now", NOW, env=env)
    try:
        wait_for(Path(f"{signal}.started"), holder)
        refused = invoke(db_url, "release", "hold", KEY)
        assert refused.exit_code == 2, refused.output
        assert "is running right now" in refused.stderr, refused.stderr
    finally:
        signal.touch()
        _out, err = holder.communicate(timeout=120)
    assert holder.returncode == 0, err
    assert claims(db_url) == [("hold", KEY)]  # the refusal deleted nothing
    released = invoke(db_url, "release", "hold", KEY)
    assert released.exit_code == 0, released.output
    assert claims(db_url) == []


def renamed(db_url: str, *args: str) -> Result:
    """`oncely ARGS` with the next release's app, where `minutely` is `every_minute`."""
    sys.modules.pop(RENAMED.split(":")[0], None)
    return CliRunner().invoke(cli, ["--app", RENAMED, "--database-url", db_url, *args])


def audit(db_url: str) -> list[tuple[str, str, str]]:
    engine = engine_for(db_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT action, target, result FROM oncely_audit ORDER BY id"))
        return [tuple(r) for r in rows.all()]  # type: ignore[misc]


def test_rename_carries_the_ledger(db_url: str) -> None:
    assert invoke(db_url, "migrate").exit_code == 0
    assert invoke(db_url, "run", "minutely", "--now", NOW).exit_code == 0
    assert invoke(db_url, "run", "minutely", "--now", "2026-12-01T10:01:00Z").exit_code == 0
    done = renamed(db_url, "rename", "minutely", "every_minute")
    assert done.exit_code == 0, done.output
    assert "moved 2 claims" in done.stdout
    assert claims(db_url) == [("every_minute", KEY), ("every_minute", "2026-12-01T10:01:00Z")]
    moved = "moved 2 claims, 0 attempt records, 0 pauses, 0 audit rows"
    assert audit(db_url) == [("rename", "minutely -> every_minute", moved)]
    # NEW has a history now: a second rename into it is refused, forced or not (two jobs'
    # histories are never mixed).
    assert invoke(db_url, "run", "minutely", "--now", NOW).exit_code == 0
    before = snapshot(db_url)
    for force in ([], ["--force"]):
        refused = renamed(db_url, "rename", "minutely", "every_minute", *force)
        assert refused.exit_code == 2, refused.output
        assert "already has a history (2 claims" in refused.stderr, refused.output
        assert snapshot(db_url) == before


def test_rename_while_old_is_still_registered_is_refused_and_changes_nothing(
    db_url: str,
) -> None:
    # The app still has `minutely`: moving its claims would let its workers run the slot again.
    assert invoke(db_url, "migrate").exit_code == 0
    assert invoke(db_url, "run", "minutely", "--now", NOW).exit_code == 0
    before = snapshot(db_url)
    refused = invoke(db_url, "rename", "minutely", "every_minute")
    assert refused.exit_code == 2, refused.output
    assert "is still registered in this app" in one_clear_line(refused.stderr)
    assert snapshot(db_url) == before
    again = invoke(db_url, "run", "minutely", "--now", NOW, "--json")
    assert again.exit_code == 0 and '"skipped"' in again.stdout  # OLD's slot did not run twice
    forced = invoke(db_url, "rename", "minutely", "every_minute", "--force")
    assert forced.exit_code == 0, forced.output
    assert claims(db_url) == [("every_minute", KEY)]
    assert audit(db_url) == [
        (
            "rename",
            "minutely -> every_minute",
            "moved 1 claims, 0 attempt records, 0 pauses, 0 audit rows (--force)",
        )
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["rename", "no_claims_yet", "other"],
        ["rename", "minutely", "bad name!"],
        ["rename", "minutely", "minutely"],
        ["rename", "minutely", "x" * 300],
        ["rename", "minutely"],
    ],
)
def test_rename_bad_input_is_exit_2(db_url: str, args: list[str]) -> None:
    assert invoke(db_url, "migrate").exit_code == 0
    assert invoke(db_url, "run", "minutely", "--now", NOW).exit_code == 0
    before = snapshot(db_url)
    result = invoke(db_url, *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert snapshot(db_url) == before


async def test_rename_carries_a_given_up_slot_to_the_new_name(db_url: str) -> None:
    """A slot given up under OLD stays given up under NEW: its end record moves with the
    claims, so the renamed job does not start it again."""
    from oncely import Oncely, RetryPolicy, every

    app = Oncely(db_url)
    slot = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)

    @app.job(every(minutes=1), retry=RetryPolicy(attempts=1))  # given up at its first failure
    async def flaky(db, now):  # type: ignore[no-untyped-def]
        if now == slot:
            raise RuntimeError("gateway down")

    @app.job(every(minutes=1))
    async def flaky_v2(db, now):  # type: ignore[no-untyped-def]
        return None

    try:
        await app.migrate()
        with pytest.raises(RuntimeError):
            await app.run("flaky", now=slot)
        assert (await app.run("flaky", now=slot)).status.value == "given_up"
        assert (await app.run("flaky", now=slot + timedelta(minutes=1))).status.value == "ran"
        await app.rename("flaky", "flaky_v2", force=True)
        assert (await app.run("flaky_v2", now=slot)).status.value == "given_up"
        assert (await app.run("flaky_v2", now=slot + timedelta(minutes=1))).status.value == (
            "skipped"
        )
    finally:
        await app.aclose()


async def test_a_backfill_plan_shows_a_given_up_slot_until_it_is_released(db_url: str) -> None:
    """A backfill does not offer to run a slot whose attempt gave it up: the plan says so, and
    an operator's release makes it a slot the backfill runs."""
    from oncely import Oncely, RetryPolicy, every

    app = Oncely(db_url)
    slot = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)
    calls: list[datetime] = []

    @app.job(every(minutes=1), retry=RetryPolicy(attempts=1))  # given up at its first failure
    async def flaky(db, now):  # type: ignore[no-untyped-def]
        calls.append(now)
        if len(calls) == 1:
            raise RuntimeError("gateway down")

    try:
        await app.migrate()
        with pytest.raises(RuntimeError):
            await app.run("flaky", now=slot)
        end = slot + timedelta(minutes=2)
        plan = await app.backfill_plan("flaky", slot, end)
        assert [p.action for p in plan] == ["given up", "would run"]
        assert [r.status.value for r in await app.backfill("flaky", slot, end)] == ["ran"]
        key = plan[0].key
        claim, cleared = await app.release_slot("flaky", key)
        assert claim is None and cleared
        assert [p.action for p in await app.backfill_plan("flaky", slot, end)] == [
            "would run",
            "already ran",
        ]
        assert [r.status.value for r in await app.backfill("flaky", slot, end)] == ["ran"]
        assert calls == [slot, slot + timedelta(minutes=1), slot]
    finally:
        await app.aclose()
