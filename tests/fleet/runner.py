"""One fleet run from options to report: the database (a fleet database of its own on the
Postgres server, or a SQLite file), the run, the checks, the history on disk."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.clusters import own_cluster
from tests.fleet.checks import Report, check
from tests.fleet.harness import Fleet, Options, plan, postgres_database

PG_ADMIN_URL = os.environ.get(
    "ONCELY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@contextlib.contextmanager
def database(db: str, run_dir: Path) -> Iterator[tuple[str, Callable[[str], None] | None]]:
    """A fresh database for one run, and how to restart its server in a shutdown mode
    (None: not ours to restart): `postgres` (a database on the shared server, created,
    dropped after), `cluster` (a Postgres cluster of the run's own, tests/clusters.py) or
    `sqlite`."""
    if db == "sqlite":
        yield f"sqlite:///{run_dir / 'fleet.db'}", None
        return
    if db == "cluster":
        with (
            own_cluster("oncely_fleet") as cluster,
            postgres_database(cluster.url, "oncely_fleet") as url,
        ):
            yield url, lambda mode: cluster.ctl("restart", mode)
        return
    with postgres_database(PG_ADMIN_URL, f"oncely_fleet_{os.getpid()}") as url:
        yield url, None


async def run(options: Options) -> Report:
    """Run the fleet, check it, and write the plan, the history and the report to run_dir."""
    fleet = Fleet(options)
    out = options.run_dir
    try:
        history = await fleet.run()
        (out / "plan.json").write_text(json.dumps([s.__dict__ for s in plan(options)], indent=1))
        entries = [
            {"at": e.at.isoformat(), "kind": e.kind, "what": e.what, "result": e.result}
            for e in history.entries
        ]
        (out / "history.json").write_text(json.dumps(entries, indent=1))
        report = check(fleet, history)
    finally:
        await fleet.close()
    (out / "report.txt").write_text("\n".join([*report.lines(), report.summary()]) + "\n")
    return report


def default_run_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="oncely-fleet-"))
