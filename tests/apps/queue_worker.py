"""Run an app's queue worker in this process until SIGTERM: `python queue_worker.py APP [opts]`.

It writes `ready-<pid>` in $ONCELY_TEST_SIGNALS once it consumes. Tests SIGKILL it at will.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from pathlib import Path


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("app", help="MODULE:ATTR")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease", type=float, default=None)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--poll", type=float, default=0.2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    module, _, attr = args.app.partition(":")
    app = getattr(importlib.import_module(module), attr or "app")

    from oncely.queue import consume

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    loop.add_signal_handler(signal.SIGINT, stopping.set)
    signals = Path(os.environ.get("ONCELY_TEST_SIGNALS", "."))
    (signals / f"ready-{os.getpid()}").touch()
    try:
        await consume(
            app,
            stopping,
            concurrency=args.concurrency,
            lease=args.lease,
            batch=args.batch,
            poll=args.poll,
        )
    finally:
        await app.aclose()


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    asyncio.run(main())
