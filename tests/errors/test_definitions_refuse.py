"""Definitions and input that oncely cannot use are refused clearly: at import for a job
declared wrongly; one line and exit 2, with nothing changed, for a command's input."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.schedules.conftest import APP, everything, migrate
from tests.support import run_cli

from oncely import ConfigError, Oncely

BARE_JOB = """
from oncely import Oncely

app = Oncely()


@app.job
async def nightly(db, now):
    pass
"""


def one_line(ran: object) -> str:
    """The one `error:` line of a refused command (exit 2, no traceback)."""
    code, out, err = ran.returncode, ran.stdout, ran.stderr  # type: ignore[attr-defined]
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return str(lines[0])


def test_a_bare_job_decorator_is_refused_at_import_naming_the_fix() -> None:
    app = Oncely("sqlite:///:memory:")
    with pytest.raises(ConfigError, match=r"job 'nightly': @app\.job needs a schedule: write "):

        @app.job  # type: ignore[arg-type]
        async def nightly(db, now):  # type: ignore[no-untyped-def]
            pass

    assert len(app.registry) == 0


def test_a_bare_task_decorator_registers_the_task() -> None:
    app = Oncely("sqlite:///:memory:")

    @app.task
    async def digest(db, tenant: str) -> None:  # type: ignore[no-untyped-def]
        pass

    assert [t.name for t in app.tasks] == ["digest"]
    assert callable(digest.enqueue)


def test_a_cli_command_on_an_app_with_a_bare_job_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "bare_app.py").write_text(BARE_JOB)
    db = tmp_path / "oncely.db"
    line = one_line(
        run_cli("--app", "bare_app:app", "--database-url", f"sqlite:///{db}", "list", cwd=tmp_path)
    )
    assert "@app.job(every(...))" in line, line
    assert not db.exists()


LONG = "A" * 10_000
REFUSED = {
    "a zone of 10,000 characters": (
        ["schedules", "add", "x", "--cron", "0 9 * * *", "--tz", LONG, "--job", "report"],
        "longer than 64 characters",
    ),
    "an interval in a zone of 10,000 characters": (
        ["schedules", "add", "x", "--every", "1h", "--tz", LONG, "--job", "report"],
        "longer than 64 characters",
    ),
    "a schedule name under schedule:": (
        ["schedules", "add", "schedule:keep", "--every", "1h", "--job", "report"],
        "names schedule 'keep' in the ledger",
    ),
    "a skip of a key of 10,000 characters": (
        ["skip", "report", LONG, "--reason", "test"],
        "at most 200 characters",
    ),
    "a release of a key of 10,000 characters": (
        ["release", "report", LONG],
        "at most 200 characters",
    ),
    "a pause of a job name of 10,000 characters": (["pause", LONG], "unknown job"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_over_long_input_is_one_short_line_exit_2_and_changes_nothing(
    db_url: str, case: str
) -> None:
    migrate(db_url)
    keep = ["schedules", "add", "keep", "--every", "1h", "--job", "report"]
    assert run_cli("--app", f"{APP}:app", "--database-url", db_url, *keep).returncode == 0
    before = everything(db_url)
    args, says = REFUSED[case]
    line = one_line(run_cli("--app", f"{APP}:app", "--database-url", db_url, *args))
    assert says in line and len(line) < 400, line
    assert everything(db_url) == before
