"""Scheduled jobs on the ORM, run as `manage.py oncely run JOB --now T` in real processes."""

from __future__ import annotations

import signal
import time

import pytest
from shop_helpers import count, manage

T = "2026-06-06T00:05:00Z"  # Friday 18:05 in Mexico City: the 18:00 slot is due


def test_the_incident_three_processes_run_the_leaderboard_close_once(
    alias: str, django_project: dict[str, str]
) -> None:
    procs = [
        manage(django_project, alias, "oncely", "run", "leaderboard_close", "--now", T)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [0, 0, 0], outs
    said = [out.split()[0] for out, _err in outs]
    assert said.count("ran") == 1, outs
    assert set(said) <= {"ran", "skipped", "busy"}, outs
    assert count(alias, "shop_bonus") == 1  # one +10, not +30
    assert count(alias, "oncely_runs", "WHERE job = 'leaderboard_close'") == 1
    # Each suppressed duplicate is data, as in the plain app: what the dashboard counts.
    assert count(alias, "oncely_duplicates") == said.count("skipped"), outs


def test_each_suppressed_duplicate_is_recorded_in_oncely_duplicates(
    alias: str, django_project: dict[str, str]
) -> None:
    first = manage(django_project, alias, "oncely", "run", "leaderboard_close", "--now", T)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0 and out.startswith("ran"), (out, err)
    for _ in range(2):
        again = manage(django_project, alias, "oncely", "run", "leaderboard_close", "--now", T)
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0 and out.startswith("skipped"), (out, err)
        assert "run.skipped" in err
    where = "WHERE job = 'leaderboard_close' AND key = '2026-06-06T00:00:00Z'"
    assert count(alias, "oncely_duplicates", where) == 2
    assert count(alias, "shop_bonus") == 1


def test_a_job_that_raises_rolls_back_its_work_and_its_retry_runs_the_slot_once(
    alias: str, django_project: dict[str, str]
) -> None:
    failing = manage(
        django_project,
        alias,
        "oncely",
        "run",
        "leaderboard_close",
        "--now",
        T,
        extra={"SHOP_FAIL_AFTER_WORK": "1"},
    )
    out, err = failing.communicate(timeout=120)
    assert failing.returncode == 1, (out, err)  # the job's failure: oncely run's exit code
    assert "run.failed" in err
    assert count(alias, "shop_bonus") == 0 and count(alias, "oncely_runs") == 0
    # The failure freed the slot for a retry (recorded, not final): the scheduler's retry,
    # a second `manage.py oncely run`, runs it, and the member is paid once.
    assert count(alias, "oncely_attempts", "WHERE final") == 0
    assert count(alias, "oncely_attempts", "WHERE retry_at IS NOT NULL") == 1
    retry = manage(django_project, alias, "oncely", "run", "leaderboard_close", "--now", T)
    out, err = retry.communicate(timeout=120)
    assert retry.returncode == 0 and out.startswith("ran"), (out, err)
    assert count(alias, "shop_bonus") == 1
    again = manage(django_project, alias, "oncely", "run", "leaderboard_close", "--now", T)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0 and out.startswith("skipped"), (out, err)
    assert count(alias, "shop_bonus") == 1


def test_every_oncely_command_is_under_manage_py_with_its_exit_codes(
    alias: str, django_project: dict[str, str]
) -> None:
    unknown = manage(django_project, alias, "oncely", "run", "nope", "--now", T)
    out, err = unknown.communicate(timeout=120)
    assert unknown.returncode == 2 and "unknown job 'nope'" in err and "Traceback" not in err
    listing = manage(django_project, alias, "oncely", "list", "--json")
    out, err = listing.communicate(timeout=120)
    assert listing.returncode == 0 and "leaderboard_close" in out, err
    bad_now = manage(django_project, alias, "oncely", "run", "leaderboard_close", "--now", "x")
    out, err = bad_now.communicate(timeout=120)
    assert bad_now.returncode == 2 and "Traceback" not in err
    assert count(alias, "oncely_runs") == 0


def test_manage_py_oncely_help_names_django_s_settings_not_oncely_s_variables(
    django_project: dict[str, str],
) -> None:
    shown = manage(django_project, "default", "oncely", "--help")
    out, err = shown.communicate(timeout=120)
    assert shown.returncode == 0, err
    assert "ONCELY_DATABASE_URL" not in out and "ONCELY_APP" not in out, out
    assert 'settings.ONCELY["DATABASE"]' in out and 'settings.ONCELY["APP"]' in out, out


def test_sigkill_between_the_work_and_the_commit_then_the_retry_has_one_effect(
    alias: str, django_project: dict[str, str]
) -> None:
    killed = manage(
        django_project,
        alias,
        "oncely",
        "run",
        "leaderboard_close",
        "--now",
        T,
        extra={"SHOP_KILL_BEFORE_COMMIT": "1"},
    )
    out, err = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, (out, err)
    assert count(alias, "shop_bonus") == 0  # the work died with its transaction ...
    assert count(alias, "oncely_runs") == 0  # ... and so did the claim: the slot is free
    retry = manage(django_project, alias, "oncely", "run", "leaderboard_close", "--now", T)
    out, err = retry.communicate(timeout=120)
    assert retry.returncode == 0 and out.startswith("ran"), (out, err)
    assert count(alias, "shop_bonus") == 1


def test_manage_py_oncely_worker_runs_the_schedule_and_stops_on_sigterm(
    alias: str, django_project: dict[str, str]
) -> None:
    worker = manage(django_project, alias, "oncely", "worker", "--jobs", "tick")
    try:
        deadline = time.monotonic() + 60
        while count(alias, "shop_bonus", "WHERE member = 'tick'") < 2:
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the worker ran no tick in 60 s"
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, (out, err)
    ticks = count(alias, "shop_bonus", "WHERE member = 'tick'")
    assert count(alias, "oncely_runs", "WHERE job = 'tick'") == ticks  # one claim per effect


@pytest.mark.postgres
def test_a_loser_on_postgres_does_not_wait_for_the_holder(django_project: dict[str, str]) -> None:
    """While an attempt holds the slot (its transaction open), another answers busy at once."""
    from datetime import datetime, timezone

    from django.db import transaction
    from shop_helpers import empty

    from oncely.contrib.django.connection import lent
    from oncely.store import ClaimAnswer, ClaimRequest, borrowed

    empty("pg")
    slot = datetime(2026, 6, 6, 0, 0, tzinfo=timezone.utc)
    request = ClaimRequest("leaderboard_close", "2026-06-06T00:00:00Z", slot, "holder")
    with transaction.atomic(using="pg"):
        with lent("pg", "the holder") as conn:
            assert borrowed.lock_and_claim(conn, request) is ClaimAnswer.CLAIMED
        started = time.monotonic()
        loser = manage(django_project, "pg", "oncely", "run", "leaderboard_close", "--now", T)
        out, err = loser.communicate(timeout=120)
        took = time.monotonic() - started
        transaction.set_rollback(True, using="pg")
    assert loser.returncode == 0 and out.startswith("busy"), (out, err)
    assert "run.busy" in err
    assert count("pg", "shop_bonus") == 0
    assert took < 30  # a process start and one round trip, not a wait for the holder


def test_an_unreachable_database_is_a_clear_error_with_exit_code_2(
    django_project: dict[str, str],
) -> None:
    proc = manage(django_project, "down", "oncely", "run", "leaderboard_close", "--now", T)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (out, err)
    assert "cannot reach" in err and "Traceback" not in err
    assert "s3cret-pw" not in err + out


def test_an_attempt_whose_django_connection_fails_raises_an_oncely_error(
    django_project: dict[str, str],
) -> None:
    """The worker treats it as an outage (waits, retries the slot), not as the job's failure."""
    from datetime import datetime, timezone

    from shop.jobs import app

    from oncely import DatabaseUnavailableError
    from oncely.contrib.django.app import attempt_in_django
    from oncely.store import ClaimRequest

    slot = datetime(2026, 6, 6, 0, 0, tzinfo=timezone.utc)
    job = app.registry.job("leaderboard_close")
    request = ClaimRequest(job.name, job.key_for(slot), slot, "r1")
    with pytest.raises(DatabaseUnavailableError, match="cannot reach Django's database 'down'"):
        attempt_in_django("down", job, slot, request)


def test_call_command_runs_the_same_command_line(
    alias: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from django.core.management import call_command
    from django.test import override_settings

    with override_settings(ONCELY={"APP": "shop.jobs:app", "DATABASE": alias}):
        call_command("oncely", "run", "leaderboard_close", "--now", T)
        assert capsys.readouterr().out.startswith("ran")
        with pytest.raises(SystemExit) as exit_:
            call_command("oncely", "run", "nope")
    assert exit_.value.code == 2
    assert count(alias, "shop_bonus") == 1
