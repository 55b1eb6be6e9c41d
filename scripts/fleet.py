"""The fleet checker's long form: N real `oncely worker` processes against one database, a
seeded random schedule of operator actions (pause, resume, backfill, two backfills at once,
release, cancel, rename, a run of a future slot, a deploy of a new app version) and faults
(SIGKILL and restart, SIGSTOP past the lease, cut connections, and with `--db cluster`
restarts of a Postgres cluster of the run's own, `-m fast` and `-m immediate`), then every
slot and task checked against the fate model (tests/fleet/checks.py), and every worker
process that exited on its own during the run reported among the workers that died. Prints
each check and one summary line; exit 0 if every check passed, 1 otherwise.

    PYTHONPATH=src python scripts/fleet.py [--seed 7] [--workers 3] [--duration 600]
        [--db postgres|cluster|sqlite] [--faults/--no-faults] [--out DIR]

The plan, the history (actions with their database times), the report and each worker's log
are kept in --out (default: a new temporary directory, printed).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.fleet

from tests.fleet.harness import Options
from tests.fleet.runner import database, default_run_dir, run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of actions")
    parser.add_argument(
        "--db",
        choices=("postgres", "cluster", "sqlite"),
        default="postgres",
        help="postgres: a database on the server of $ONCELY_TEST_POSTGRES_URL; cluster: a "
        "Postgres cluster of the run's own, which the `restart` and `restart_immediate` faults "
        "restart (root, Debian's pg_createcluster); sqlite: a file",
    )
    parser.add_argument("--faults", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--lease", type=float, default=3.0, help="the workers' task lease")
    parser.add_argument("--out", type=Path, default=None, help="where to keep the run's files")
    parser.add_argument(
        "--group",
        type=int,
        default=5,
        help="the odd-numbered workers run with `oncely worker --group` this (Postgres; 1: none)",
    )
    args = parser.parse_args()
    if args.workers < 1 or args.duration <= 0 or args.lease <= 0:
        parser.error("--workers, --duration and --lease must be positive")
    if not 1 <= args.group <= 50:
        parser.error("--group must be from 1 to 50")
    run_dir = args.out or default_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"fleet: seed {args.seed}, {args.workers} workers, {args.duration:g}s on {args.db}; "
        f"files in {run_dir}",
        flush=True,
    )
    with database(args.db, run_dir) as (url, restart):
        options = Options(
            url=url,
            run_dir=run_dir,
            seed=args.seed,
            workers=args.workers,
            duration=args.duration,
            faults=args.faults,
            lease=args.lease,
            restart=restart,
            group=args.group,
        )
        report = asyncio.run(run(options))
    print("\n".join(report.lines()))
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
