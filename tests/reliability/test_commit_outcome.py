"""A connection lost during COMMIT is not "rolled back": oncely reconnects and reads back what
the transaction wrote (the slot's claim, the task by its id) and reports that; if it cannot
read it back, it says `unknown` (exit 3) and never "nothing changed"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from tests.conftest import _reset_postgres
from tests.reliability.commit_cut import CommitCut
from tests.reliability.helpers import engine_for, oncely

NOW = "2026-12-01T10:00:00Z"
pytestmark = pytest.mark.postgres


@pytest.fixture
def pg(postgres_database: str) -> str:
    _reset_postgres(postgres_database)
    assert oncely(postgres_database, "migrate").returncode == 0
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
    done = oncely(via_proxy, "run", "minutely", "--now", NOW)
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
    again = oncely(pg, "run", "minutely", "--now", NOW)
    assert again.returncode == 0 and again.stdout.startswith("skipped"), again.stdout


def test_enqueue_reports_a_commit_that_landed_or_unknown(
    pg: str, cut: tuple[CommitCut, str]
) -> None:
    proxy, via_proxy = cut
    done = oncely(via_proxy, "enqueue", "note", "--json", '{"n": 1}')
    assert proxy.cut.is_set(), done.stderr
    assert rows(pg, "oncely_tasks") == 1  # the commit landed
    assert "nothing" not in done.stdout + done.stderr
    if proxy.refuse_after_cut:
        assert done.returncode == 3, (done.stdout, done.stderr)
        assert "outcome unknown" in done.stderr and "may or may not be queued" in done.stderr
    else:
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert done.stdout.startswith("enqueued note id "), done.stdout
