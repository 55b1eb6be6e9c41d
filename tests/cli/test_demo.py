"""`oncely demo`: the incident replayed by real processes, its numbers checked in the database."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.support import ROOT, run_cli

from oncely import schema

TOP3 = ["ana", "beto", "carla"]
EXPECTED = {
    "naive": {"notifications": 3, "coins": 30, "closed": 3},
    "sentinel": {"notifications": 3, "coins": 30, "closed": 3},
    "oncely": {"notifications": 1, "coins": 10, "closed": 1},
}


def counted(engine: sa.Engine) -> dict[str, dict[str, object]]:
    """Each scenario's effects, counted with plain SQL, independently of the demo's code."""
    found: dict[str, dict[str, object]] = {}
    with engine.connect() as conn:
        for scenario in EXPECTED:
            args = {"s": scenario}
            notes = conn.execute(
                sa.text(
                    "SELECT member, count(*) FROM demo_notifications WHERE scenario = :s "
                    "GROUP BY member ORDER BY member"
                ),
                args,
            ).all()
            coins = conn.execute(
                sa.text(
                    "SELECT member, sum(amount) FROM demo_coins WHERE scenario = :s "
                    "GROUP BY member ORDER BY member"
                ),
                args,
            ).all()
            closers = conn.execute(
                sa.text("SELECT count(DISTINCT replica) FROM demo_coins WHERE scenario = :s"), args
            ).scalar_one()
            threads = conn.execute(
                sa.text("SELECT count(*) FROM demo_threads WHERE scenario = :s"), args
            ).scalar_one()
            found[scenario] = {
                "notifications": {m: int(n) for m, n in notes},
                "coins": {m: int(n) for m, n in coins},
                "closed": int(closers),
                "threads": int(threads),
            }
        found["claims"] = {
            "n": conn.execute(
                sa.text("SELECT count(*) FROM oncely_runs WHERE job = 'leaderboard_close'")
            ).scalar_one()
        }
    return found


def check_report(report: dict[str, object], engine: sa.Engine) -> None:
    db = counted(engine)
    scenarios = report["scenarios"]
    assert isinstance(scenarios, dict)
    for name, want in EXPECTED.items():
        got = scenarios[name]
        # What the demo reported is what the database holds ...
        assert got["notifications"] == db[name]["notifications"]
        assert got["coins"] == db[name]["coins"]
        assert got["closed"] == db[name]["closed"]
        assert got["threads"] == db[name]["threads"]
        # ... and it is the incident, then the fix.
        assert db[name]["notifications"] == {m: want["notifications"] for m in TOP3}
        assert db[name]["coins"] == {m: want["coins"] for m in TOP3}
        assert db[name]["closed"] == want["closed"]
    assert db["naive"]["threads"] == 3  # the section exists in (a): three summary threads
    assert db["sentinel"]["threads"] == 0  # the renamed section: the sentinel never lands
    assert report["claims"] == db["claims"]["n"] == 1
    assert report["ok"] is True


def test_demo_default_replays_the_incident_and_leaves_nothing(tmp_path: Path) -> None:
    # $ONCELY_DATABASE_URL is ignored: the demo never writes where the environment points.
    elsewhere = tmp_path / "mine.db"
    started = time.monotonic()
    proc = run_cli("demo", cwd=tmp_path, env={"ONCELY_DATABASE_URL": f"sqlite:///{elsewhere}"})
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # It takes seconds; the bound catches a hang, not a slow machine (CI gates on no timing).
    assert elapsed < 120, f"the demo took {elapsed:.1f}s"
    out = proc.stdout
    lines = out.splitlines()
    assert lines[0].startswith("oncely demo:")
    assert out.count("try-lock acquired; Friday window -> closed the week") == 3
    assert out.count("post_thread returned None: section 'general' is missing") == 3
    assert out.count("skipped leaderboard_close slot 2026-05-29T18:00:00-06:00 key 2026-W22") == 2
    assert out.count("already ran (claimed by") == 2
    assert out.count("run.skipped: already ran, skipping") == 2
    table = lines[lines.index("Before / after (counted in the database after the runs):") + 1 :]
    assert " ".join(table[1].split()) == "(a) try-lock only 3 3 3 +30 +30 +30 3 3 times"
    assert " ".join(table[2].split()).endswith(" 3 3 3 +30 +30 +30 0 3 times")
    assert " ".join(table[3].split()) == "(c) oncely 1 1 1 +10 +10 +10 0 once"
    # The docs show this very table.
    assert "\n".join(table[:4]) in (ROOT / "docs" / "demo.md").read_text()
    assert not elsewhere.exists()
    assert list(tmp_path.iterdir()) == []  # nothing written in the working directory either
    leftovers = [p for p in Path(_tmpdir()).glob("oncely-demo-*") if p.stat().st_mtime >= started]
    assert leftovers == []


def _tmpdir() -> str:
    import tempfile

    return tempfile.gettempdir()


def test_demo_numbers_match_the_database(
    db_url: str, sync_engine: sa.Engine, tmp_path: Path
) -> None:
    # On an empty database, without --keep: nothing is left, not even oncely's tables,
    # which the demo created.
    first = run_cli("--database-url", db_url, "demo", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert sa.inspect(sync_engine).get_table_names() == []
    # With --keep the rows stay, and what the demo reports is what the database holds.
    proc = run_cli("demo", "--database-url", db_url, "--keep", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kept"] is True
    check_report(report, sync_engine)
    # Again on the same database: the kept rows are replaced, the numbers are the same, and
    # this time only the demo's own tables and claim go (oncely's tables were there before).
    again = run_cli("demo", "--database-url", db_url, "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["scenarios"] == report["scenarios"]
    assert sorted(sa.inspect(sync_engine).get_table_names()) == sorted(schema.metadata.tables)
    with sync_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM oncely_runs")).scalar_one() == 0


def test_demo_keep_leaves_a_sqlite_file_to_inspect(tmp_path: Path) -> None:
    proc = run_cli("demo", "--keep", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    path = Path(report["path"]) / "demo.db"
    assert path.exists()
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        check_report(report, engine)
        hist = run_cli(
            "--database-url", f"sqlite:///{path}", "history", "leaderboard_close", cwd=tmp_path
        )
        assert "2026-W22" in hist.stdout
    finally:
        engine.dispose()
        import shutil

        shutil.rmtree(report["path"])


@pytest.mark.parametrize("log_level", ["info", "debug"])
def test_demo_unreachable_database_is_a_clear_error_without_the_password(
    tmp_path: Path, log_level: str
) -> None:
    url = "postgresql://oncely:s3cret@127.0.0.1:1/nowhere"
    proc = run_cli("--log-level", log_level, "demo", "--database-url", url, cwd=tmp_path)
    assert proc.returncode == 2
    assert "cannot reach the database at postgresql+asyncpg://oncely:***@127.0.0.1:1/nowhere" in (
        proc.stderr
    )
    assert "s3cret" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u:s3cret@h/x", "unsupported database 'mysql' in 'mysql://u:***@h/x'"),
        ("sqlite:////nonexistent/dir/x.db", "cannot reach the database at sqlite+aiosqlite:///"),
    ],
)
def test_demo_bad_database_url_is_a_clear_error(tmp_path: Path, url: str, message: str) -> None:
    proc = run_cli("demo", "--database-url", url, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "s3cret" not in proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []
