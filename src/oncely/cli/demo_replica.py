"""A replica process of `oncely demo`: `python -m oncely.cli.demo_replica REPLICA`.

It ticks as `oncely.demo.replica` describes; oncely's scenario runs the real `oncely run`
command in this process, which is why the process starts here, above the demo.
"""

from __future__ import annotations

import os
import sys

from ..demo import leaderboard, replica
from . import cli


def run_oncely(name: str, now: str) -> int:
    """`oncely run leaderboard_close --now NOW`, the real command, in this process."""
    os.environ[leaderboard.REPLICA_ENV] = name
    try:
        cli.main(
            args=["--app", replica.APP_SPEC, "run", "leaderboard_close", "--now", now],
            prog_name="oncely",
        )
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(replica.serve(sys.argv[1:], run_oncely))
