"""The cost of oncely's tracing: bench/queues.py's oncely rows, three ways, interleaved in one run.

    python bench/otel_overhead.py --rounds 3 --tasks 5000 --single 1000

- `absent`: OpenTelemetry not importable (as without the `otel` extra: its imports fail);
- `api`: the API installed, no tracer provider configured (the default: no spans);
- `sdk`: the SDK's tracer provider configured, with no exporter (spans are made and dropped:
  what tracing itself costs, not an exporter's network).

Each round runs `bench/queues.py --systems oncely` once per mode, in a process of its own, in
turn; the best round of each row is kept (the machine is shared) and printed beside `absent`
as a ratio. Never a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUEUES = ROOT / "bench" / "queues.py"

PRELUDES = {
    "absent": "import sys; sys.modules['opentelemetry'] = None",
    "api": "import opentelemetry.trace",
    "sdk": (
        "from opentelemetry import trace; from opentelemetry.sdk.trace import TracerProvider; "
        "trace.set_tracer_provider(TracerProvider())"
    ),
}
_ROW = re.compile(r"^\s+oncely\s+(.+? /s)\s+([\d.]+)")

# What oncely's code adds per operation for tracing, timed alone (best of many repeats: the
# least disturbed): an enqueue's span and context, an attempt's span start and end, a slot
# attempt's span, and the events observer for an event that is not a span event.
HOOKS = """
import json, sys, timeit
sys.path.insert(0, {src!r})
from oncely import tracing
from oncely.model import TaskRecord
from datetime import datetime, timezone
now = datetime.now(timezone.utc)
rec = TaskRecord(id=1, task="t", queue="default", args={{}}, state="available", attempt=0,
                 run_at=now, created_at=now)

def enqueue():
    entries = [{{"task": "t", "queue": "default", "args": {{}}}}]
    with tracing.enqueuing("t", "default", entries) as span:
        tracing.enqueued(span, [rec])

def attempt():
    span = tracing.task_attempt("t", 1, 1, "default", None)
    with tracing.current(span):
        pass
    with tracing.ended(span, "succeeded", None):
        pass

def slot():
    with tracing.slot_attempt("j", "k", now, "r") as span:
        tracing.finish(span, "ran", None)

def observer():
    tracing._on_event("task.started", {{"task": "t", "id": 1}})

def nothing():
    pass

out = {{}}
for name, call in [("enqueue", enqueue), ("attempt", attempt), ("slot attempt", slot),
                   ("observer, other event", observer), ("an empty call", nothing)]:
    n = {calls}
    out[name] = min(timeit.repeat(call, number=n, repeat=15)) / n * 1e9
print(json.dumps(out))
"""


def hooks(mode: str, calls: int) -> dict[str, float]:
    """ns per call of oncely's tracing work under `mode`, in a process of its own."""
    code = PRELUDES[mode] + "\n" + HOOKS.format(src=str(ROOT / "src"), calls=calls)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{mode}: the hooks' timing failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout)
    return result


def run(mode: str, args: list[str]) -> dict[str, float]:
    """One run of bench/queues.py under `mode`; its rows (metric -> rate)."""
    code = f"{PRELUDES[mode]}; import runpy; runpy.run_path({str(QUEUES)!r}, run_name='__main__')"
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{mode}: bench/queues.py failed:\n{done.stderr}")
    rows: dict[str, float] = {}
    for line in done.stdout.splitlines():
        match = _ROW.match(line)
        if match:
            rows[match[1]] = max(rows.get(match[1], 0.0), float(match[2]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--single", type=int, default=1_000)
    parser.add_argument("--concurrency", default="10")
    parser.add_argument("--modes", default="absent,api,sdk")
    parser.add_argument("--no-enqueue", action="store_true", help="the one-row drain alone")
    parser.add_argument("--fsync", action="store_true", help="commits wait for the disk")
    parser.add_argument("--hooks-only", action="store_true", help="only the per-call costs")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed repeat")
    parser.add_argument("--database-prefix", default="bench_otel")
    args = parser.parse_args()
    modes = args.modes.split(",")
    costs = {mode: hooks(mode, args.calls) for mode in modes}
    print(f"{'ns per call':28}" + "".join(f"{m:>12}" for m in modes))
    for name in costs[modes[0]]:
        print(f"{name:28}" + "".join(f"{costs[m][name]:12.0f}" for m in modes))
    if args.hooks_only:
        return
    queues = ["--database-url", args.database_url, "--systems", "oncely", "--rounds", "1"]
    queues += ["--tasks", str(args.tasks), "--single", str(args.single)]
    queues += ["--concurrency", args.concurrency, "--drains", "one_row", "--no-latency"]
    queues += ["--database-prefix", args.database_prefix]
    if not args.fsync:
        queues.append("--no-fsync")  # round trips and CPU, not the shared disk, dominate
    if args.no_enqueue:
        queues.append("--no-enqueue")
    best: dict[str, dict[str, float]] = {mode: {} for mode in modes}
    for round_no in range(args.rounds):
        for mode in modes:
            for metric, rate in run(mode, queues).items():
                best[mode][metric] = max(best[mode].get(metric, 0.0), rate)
            print(f"round {round_no + 1}/{args.rounds} {mode}: done", flush=True)
    base = modes[0]
    print(
        f"\n{'row':56}"
        + "".join(f"{m:>12}" for m in modes)
        + "".join(f"{m + '/' + base:>14}" for m in modes[1:])
    )
    for metric in best[base]:
        rates = [best[m].get(metric, 0.0) for m in modes]
        ratios = [r / rates[0] if rates[0] else 0.0 for r in rates[1:]]
        print(
            f"{metric:56}"
            + "".join(f"{r:12.0f}" for r in rates)
            + "".join(f"{x:14.2f}" for x in ratios)
        )


if __name__ == "__main__":
    main()
