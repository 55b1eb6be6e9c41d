"""A connection lost during COMMIT is not "rolled back": oncely reconnects and reads back what
the transaction wrote (the slot's claim, the task by its id) and reports that; if it cannot
read it back, it says `unknown` (exit 3) and never "nothing changed"."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from tests.conftest import _reset_postgres
from tests.jobs.commit_cut import CommitCut
from tests.support import cli_on, engine_for

NOW = "2026-12-01T10:00:00Z"
pytestmark = pytest.mark.postgres


@pytest.fixture
def pg(postgres_database: str) -> str:
    _reset_postgres(postgres_database)
    assert cli_on(postgres_database, "migrate").returncode == 0
    return postgres_database


@pytest.fixture(params=[False, True], ids=["readable", "unreachable"])
def cut(request: pytest.FixtureRequest, pg: str) -> Iterator[tuple[CommitCut, str]]:
    url = make_url(pg)
    proxy = CommitCut((url.host or "127.0.0.1", url.port or 5432), refuse_after_cut=request.param)
    yield proxy, url.set(host="127.0.0.1", port=proxy.port).render_as_string(False)
    proxy.close()


def rows(pg: str, table: str) -> int:
    engine = engine_for(pg)
    with engine.connect() as conn:
        count = conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
    engine.dispose()
    return int(count)


def test_run_reports_a_commit_that_landed_or_unknown(pg: str, cut: tuple[CommitCut, str]) -> None:
    proxy, via_proxy = cut
    done = cli_on(via_proxy, "run", "minutely", "--now", NOW)
    assert proxy.cut.is_set(), done.stderr
    assert rows(pg, "oncely_runs") == 1  # the commit landed
    assert "the slot is free" not in done.stdout + done.stderr
    if proxy.refuse_after_cut:
        assert done.returncode == 3, (done.stdout, done.stderr)
        assert done.stderr.splitlines()[-1].startswith("unknown minutely"), done.stderr
        assert "may or may not have committed" in done.stderr
    else:
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert done.stdout.startswith("ran minutely"), done.stdout
    # A rerun is safe either way: the landed claim makes it skip.
    again = cli_on(pg, "run", "minutely", "--now", NOW)
    assert again.returncode == 0 and again.stdout.startswith("skipped"), again.stdout


def test_enqueue_reports_a_commit_that_landed_or_unknown(
    pg: str, cut: tuple[CommitCut, str]
) -> None:
    proxy, via_proxy = cut
    done = cli_on(via_proxy, "enqueue", "note", "--json", '{"n": 1}')
    assert proxy.cut.is_set(), done.stderr
    assert rows(pg, "oncely_tasks") == 1  # the commit landed
    assert "nothing" not in done.stdout + done.stderr
    if proxy.refuse_after_cut:
        assert done.returncode == 3, (done.stdout, done.stderr)
        assert "outcome unknown" in done.stderr and "may or may not be queued" in done.stderr
    else:
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert done.stdout.startswith("enqueued note id "), done.stdout


# A deferred constraint trigger that makes every COMMIT of a row in `table` take 1.5 s: the
# connection is cut while the server still runs the COMMIT (as with a synchronous standby).
SLOW_COMMIT = (
    "CREATE OR REPLACE FUNCTION slow_commit() RETURNS trigger AS $$ "
    "BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$ LANGUAGE plpgsql",
    "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON {table} "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()",
)


def slow_commits(pg: str, table: str) -> None:
    engine = engine_for(pg)
    with engine.begin() as conn:
        for statement in SLOW_COMMIT:
            conn.exec_driver_sql(statement.format(table=table))
    engine.dispose()


def landed(pg: str, table: str) -> None:
    """Wait (10 s at most) for the slow COMMIT's row: it landed, whatever the client said."""
    deadline = time.monotonic() + 10
    while rows(pg, table) != 1:
        assert time.monotonic() < deadline, f"the COMMIT into {table} never landed"
        time.sleep(0.05)


@pytest.fixture
def readable_cut(pg: str) -> Iterator[tuple[CommitCut, str]]:
    url = make_url(pg)
    proxy = CommitCut((url.host or "127.0.0.1", url.port or 5432))
    yield proxy, url.set(host="127.0.0.1", port=proxy.port).render_as_string(False)
    proxy.close()


def test_run_waits_for_a_slow_lost_commit_and_reports_it_ran(
    pg: str, readable_cut: tuple[CommitCut, str]
) -> None:
    proxy, via_proxy = readable_cut
    slow_commits(pg, "oncely_runs")
    done = cli_on(via_proxy, "run", "minutely", "--now", NOW)
    assert proxy.cut.is_set(), done.stderr
    landed(pg, "oncely_runs")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.startswith("ran minutely"), done.stdout
    assert "the slot is free" not in done.stdout + done.stderr


def test_enqueue_waits_for_a_slow_lost_commit_and_reports_it_enqueued(
    pg: str, readable_cut: tuple[CommitCut, str]
) -> None:
    proxy, via_proxy = readable_cut
    slow_commits(pg, "oncely_tasks")
    done = cli_on(via_proxy, "enqueue", "note", "--json", '{"n": 1}')
    assert proxy.cut.is_set(), done.stderr
    landed(pg, "oncely_tasks")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.startswith("enqueued note id "), done.stdout
