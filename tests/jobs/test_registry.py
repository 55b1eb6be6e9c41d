"""Fail at registration, not at 3 a.m.: every bad declaration names the job."""

from __future__ import annotations

from datetime import datetime

import pytest

from oncely import ConfigError, Oncely, UnknownJobError, cron, every


def make_app() -> Oncely:
    return Oncely("sqlite:///:memory:")


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (cron("0 25 * * *"), r"job 'nightly': bad cron expression '0 25 \* \* \*'"),
        (
            cron("0 18 * * FRI", tz="America/Mexico_Cty"),
            r"job 'nightly': unknown time zone 'America/Mexico_Cty'",
        ),
        (every(seconds=0), r"job 'nightly': every\(\.\.\.\) needs"),
        ("0 18 * * FRI", r"job 'nightly': the schedule must be cron\(\.\.\.\) or every"),
    ],
)
def test_bad_schedule_names_the_job(schedule, message: str) -> None:  # type: ignore[no-untyped-def]
    app = make_app()
    with pytest.raises(ConfigError, match=message):

        @app.job(schedule)
        async def nightly(db, now):  # type: ignore[no-untyped-def]
            pass

    assert len(app.registry) == 0


def test_duplicate_name_is_refused() -> None:
    app = make_app()

    @app.job(every(minutes=5))
    async def sweep(db, now):  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(ConfigError, match="job 'sweep' is registered twice"):

        @app.job(every(minutes=10), name="sweep")
        async def other(db, now):  # type: ignore[no-untyped-def]
            pass

    assert [j.name for j in app.registry] == ["sweep"]


def test_wrong_signature_is_refused() -> None:
    app = make_app()
    with pytest.raises(ConfigError, match=r"job 'lonely': the function must accept two"):

        @app.job(every(minutes=5))
        async def lonely(db):  # type: ignore[no-untyped-def]
            pass


def test_bad_name_and_bad_key_function() -> None:
    app = make_app()
    with pytest.raises(ConfigError, match="job name 'two words' is not valid"):
        app.job(every(minutes=5), name="two words")(lambda db, now: None)
    with pytest.raises(ConfigError, match="job 'weekly': key= must be a function"):
        app.job(every(minutes=5), name="weekly", key="2026-W48")(  # type: ignore[arg-type]
            lambda db, now: None
        )


def test_custom_key_function_and_unknown_job() -> None:
    app = make_app()

    @app.job(
        cron("0 18 * * FRI", tz="America/Mexico_City"), key=lambda slot: slot.strftime("%G-W%V")
    )
    def weekly(db, now):  # type: ignore[no-untyped-def]
        pass

    from zoneinfo import ZoneInfo

    slot = app.slot("weekly", datetime(2026, 11, 28, 9, tzinfo=ZoneInfo("UTC")))
    assert slot.key == "2026-W48"
    assert slot.at.isoformat() == "2026-11-27T18:00:00-06:00"
    with pytest.raises(UnknownJobError, match=r"unknown job 'weekley' \(known jobs: weekly\)"):
        app.slot("weekley")
