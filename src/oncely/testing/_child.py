"""A child process that delivers one target: `python -m oncely.testing._child SPEC.json`.

The spec says what to deliver and how to synchronise with the test: touch `ready` and wait
for `go` (a start line for concurrent deliveries), or touch `at_commit` when the work is
done and wait there to be SIGKILLed. The outcome is written to `out` as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .. import hooks
from .clock import FrozenClock
from .targets import Delivery, target_from_spec

HOLD_SECONDS = 120.0
"""How long a child stopped at its commit waits to be killed before giving up."""


def _wait_for(path: Path, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {limit}s")
        time.sleep(0.005)


def _hold_at_commit(signal_file: Path) -> None:
    def hold(job: str, key: str) -> None:
        # Written aside, then renamed: the test kills us as soon as the name appears.
        tmp = signal_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"job": job, "key": key, "pid": os.getpid()}))
        tmp.rename(signal_file)
        time.sleep(HOLD_SECONDS)  # the test SIGKILLs us here; nothing else to wait for
        raise SystemExit("held at the commit and never killed")

    hooks.add_before_commit(hold)


async def _main(spec: dict[str, Any]) -> Delivery:
    target = target_from_spec(spec["target"])
    if spec.get("at_commit"):
        _hold_at_commit(Path(spec["at_commit"]))
    if spec.get("ready"):
        Path(spec["ready"]).touch()
        _wait_for(Path(spec["go"]), float(spec.get("timeout", 60)))
    return await target.deliver()


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    clock = FrozenClock(spec["clock"]) if spec.get("clock") else None
    if clock is not None:
        clock.install()
    delivery = asyncio.run(_main(spec))
    out = Path(spec["out"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(delivery.to_json()))
    tmp.rename(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
