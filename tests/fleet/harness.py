"""Run a fleet: N real `oncely worker` processes on one database, a seeded schedule of
operator actions (through the public API and the CLI) and faults (SIGKILL, SIGSTOP past the
lease, cut connections), a history of what was done when; then every slot and task is
checked against the fate model (tests/fleet/checks.py).

The plan (which action, when, on what) is a pure function of the seed and the options, so a
seed does the same things in the same order each time; what the workers make of them is the
system under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

from oncely import Oncely
from oncely.errors import BadInputError

ROOT = Path(__file__).resolve().parents[2]
APP_FILE = Path(__file__).with_name("app.py")
APP = "tests.fleet.app:app"
JOBS = ("tick_all", "tick_latest", "flaky", "timeouty", "slow")

ACTIONS: dict[str, int] = {
    "enqueue": 6,
    "enqueue_again": 2,
    "enqueue_limited": 2,
    "pause": 3,
    "backfill": 2,
    "backfill_twice": 1,
    "release": 2,
    "cancel": 2,
    "rename": 1,
    "run_future": 1,
    "deploy": 1,
    "schedule": 3,
}
"""Operator actions and their weights in a plan."""
BACKLOG = 40
"""The tasks enqueued before the workers start (`grouped_work` where a worker runs groups)."""
SCHEDULES = ("s1", "s2", "s3")
"""The names the fleet's schedules kept as data take (`s1` exists from the start)."""
FAULTS: dict[str, int] = {"kill": 4, "stop": 3, "cut": 3, "restart": 2, "restart_immediate": 2}
"""Faults and their weights (`cut`: Postgres only; `restart` (`-m fast`) and
`restart_immediate` (`-m immediate`: every backend killed, the server recovering as after a
crash): a cluster of the fleet's own)."""


@dataclass(frozen=True)
class Options:
    """One fleet run."""

    url: str
    run_dir: Path
    seed: int = 7
    workers: int = 3
    duration: float = 40.0
    faults: bool = True
    lease: float = 3.0
    step: float = 2.0
    """Seconds between two planned actions (a fault is one of them)."""
    restart: Callable[[str], None] | None = None
    """Restart the fleet's own Postgres cluster in a shutdown mode (`fast`, `immediate`)
    (`--db cluster`); None: no such fault."""
    group: int = 5
    """The odd-numbered workers run with `--group` this (Postgres; 1: none does): with a
    backlog, up to this many tasks in one transaction, a savepoint each."""

    @property
    def postgres(self) -> bool:
        return self.url.startswith("postgres")


@dataclass(frozen=True)
class Step:
    """One planned action: when (seconds after the start), what, and on which target."""

    at: float
    kind: str
    target: int


@dataclass
class Entry:
    """One action as it happened: when (database time), what, and what came of it."""

    at: datetime
    kind: str
    what: str
    result: str


@dataclass
class History:
    """Everything the harness did, in order, and what the checks need of it."""

    started: datetime | None = None
    stopped: datetime | None = None
    entries: list[Entry] = field(default_factory=list)
    enqueued: set[str] = field(default_factory=set)
    """The idempotency keys of every task enqueued (each must take effect exactly once)."""
    refusals_missing: list[str] = field(default_factory=list)
    """Actions the model says must be refused, that were not."""
    limited_max: int = 0
    """The most `limited` tasks (concurrency 1) seen running at once in the database."""
    backfills: list[subprocess.Popen[str]] = field(default_factory=list)
    removed: dict[str, datetime] = field(default_factory=dict)
    """Each schedule removed, and when (database time, just after the removal committed):
    no slot of it may start after that."""
    died: list[str] = field(default_factory=list)
    """Worker processes that exited on their own during the run (not stopped or killed by
    the harness): each a failure of the check `workers that died`."""

    def count(self, kinds: tuple[str, ...] | dict[str, int]) -> int:
        return sum(1 for e in self.entries if e.kind in kinds)


def plan(options: Options) -> list[Step]:
    """The seeded schedule: one action every `step` seconds, faults among them; each kind
    at least once when there are enough steps, the others drawn by weight, in seeded order."""
    rng = random.Random(options.seed)
    kinds = dict(ACTIONS)
    if options.faults:
        kinds |= {k: w for k, w in FAULTS.items() if _possible(k, options)}
    names, weights = list(kinds), list(kinds.values())
    times = []
    at = options.step
    while at < options.duration:
        times.append(round(at, 2))
        at += options.step
    chosen = names[: len(times)] if len(times) < len(names) else list(names)
    chosen += rng.choices(names, weights, k=len(times) - len(chosen))
    rng.shuffle(chosen)
    return [Step(t, kind, rng.randrange(1 << 30)) for t, kind in zip(times, chosen, strict=True)]


def _possible(fault: str, options: Options) -> bool:
    if fault == "cut":
        return options.postgres
    if fault in ("restart", "restart_immediate"):
        return options.restart is not None
    return True


def load_app(version: int, url: str) -> Oncely:
    """The fleet app of `version`, as a module of its own (both versions in one process)."""
    os.environ["ONCELY_FLEET_VERSION"] = str(version)
    spec = importlib.util.spec_from_file_location(f"fleet_app_v{version}", APP_FILE)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app: Oncely = module.app
    app.use_database(url)
    return app


def sync_url(url: str) -> str:
    parsed = make_url(url)
    if parsed.drivername.startswith("postgres"):
        return parsed.set(drivername="postgresql+psycopg2").render_as_string(False)
    return parsed.set(drivername="sqlite").render_as_string(False)


class Worker:
    """One replica: an `oncely worker` process, restarted as a new incarnation (`gen`)."""

    def __init__(self, fleet: Fleet, index: int) -> None:
        self.fleet, self.index, self.gen, self.version = fleet, index, 0, 1
        self.proc: subprocess.Popen[str] | None = None
        self.stopped = False
        self.ending = False
        """Whether the harness stops or kills the running incarnation (its exit is ours)."""

    @property
    def grouped(self) -> bool:
        """Whether this worker runs groups of tasks (its `task.started` lines say which)."""
        options = self.fleet.options
        return options.postgres and options.group > 1 and self.index % 2 == 1

    @property
    def replica(self) -> str:
        return f"fleet-w{self.index}-g{self.gen}-v{self.version}"

    def start(self) -> None:
        """Start the next incarnation, unless one runs already: a restart scheduled after a
        SIGKILL (`_do_kill`) may come after another action restarted the worker (a deploy), and
        a second process would run untracked, past the run's end."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.check_alive()
        self.gen += 1
        log = (self.fleet.options.run_dir / f"{self.replica}.log").open("w")
        env = {
            **os.environ,
            "ONCELY_DATABASE_URL": self.fleet.options.url,
            "ONCELY_REPLICA": self.replica,
            "ONCELY_FLEET_VERSION": str(self.version),
        }
        lease = self.fleet.options.lease
        command = ["worker", "--lease", str(lease), "--shutdown-timeout", "5"]
        command += ["--concurrency", "4", "--pool-size", "4"]
        if self.grouped:  # and its `task.started` lines say which tasks ran grouped
            command = ["--event-level", "task.started=info", *command]
            command += ["--group", str(self.fleet.options.group)]
        elif self.fleet.grouping:  # the `grouped` queue's backlog is the grouped workers'
            command += ["--queues", "default"]
        with log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "oncely", "--app", APP, *command],
                cwd=ROOT,
                env=env,
                text=True,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.stopped = False
        self.ending = False

    def check_alive(self) -> None:
        """Record the running incarnation as dead if it exited on its own (the harness
        neither stopped nor killed it), once: with its exit code and its last log line."""
        proc = self.proc
        if proc is None or self.ending or proc.poll() is None:
            return
        self.ending = True  # recorded once
        log = self.fleet.options.run_dir / f"{self.replica}.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        last = lines[-1] if lines else ""
        self.fleet.history.died.append(f"{self.replica} exited {proc.returncode}: {last}")

    def kill(self) -> None:
        """SIGKILL the running incarnation (a fault: its exit is the harness's)."""
        self.check_alive()
        self.ending = True
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (SIGCONT first, if stopped), then wait; SIGKILL if it does not exit."""
        if self.proc is None:
            return None
        self.check_alive()
        self.ending = True
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class Fleet:
    """The workers, the operator's apps (v1 and v2), and the history of one run."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.rng = random.Random(options.seed + 1)
        self.history = History()
        self.engine = sa.create_engine(sync_url(options.url), pool_pre_ping=True)
        self.app = load_app(1, options.url)
        self.app_v2 = load_app(2, options.url)
        self.workers = [Worker(self, i) for i in range(options.workers)]
        self.grouping = any(w.grouped for w in self.workers)
        """Some worker runs groups: the `grouped` queue is its (and its peers') alone."""
        self.deployed = False
        self.counter = 0
        self._background: set[asyncio.Task[None]] = set()

    # -- the database, read plainly --------------------------------------------------------

    def rows(self, query: str, **params: Any) -> list[Any]:
        """A plain read; retried for up to 30 s while a fault keeps the database away."""
        deadline = time.monotonic() + 30
        while True:
            try:
                with self.engine.connect() as conn:
                    return list(conn.execute(sa.text(query), params).all())
            except sa.exc.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # a retry's backoff while the server restarts

    async def db_now(self) -> datetime:
        """The database's clock (read plainly: the app's pool may hold cut connections), to
        the microsecond on Postgres and the millisecond on SQLite (whose CURRENT_TIMESTAMP
        stops at the second: a removal read so would seem to come before claims made in the
        same second before it)."""
        if self.options.postgres:
            return utc(self.rows("SELECT CURRENT_TIMESTAMP")[0][0])
        return utc(self.rows("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")[0][0])

    async def note(self, kind: str, what: str, result: str) -> None:
        self.history.entries.append(Entry(await self.db_now(), kind, what, result))

    # -- setting up and winding down -------------------------------------------------------

    async def setup(self) -> None:
        await self.app.migrate()
        from tests.fleet.app import TABLES

        with self.engine.begin() as conn:
            for statement in TABLES:
                conn.exec_driver_sql(statement)
        self.history.started = await self.db_now()
        await self._add_schedule("s1")
        # A backlog at the start, on the queue only the workers with `--group` serve (more
        # tasks than their lanes): they run groups from their first lease on, whatever the
        # other workers do. Without such workers, the same backlog of `work`.
        first = range(self.counter + 1, self.counter + 1 + BACKLOG)
        self.counter += BACKLOG
        name = "grouped_work" if self.grouping else "work"
        await self._enqueue([(name, {"n": n}, f"{name}:{n}") for n in first])
        for w in self.workers:
            w.start()

    async def run(self) -> History:
        """Set up, play the plan, finish the deploy, drain the tasks and stop the workers."""
        self.options.run_dir.mkdir(parents=True, exist_ok=True)
        await self.setup()
        try:
            monitor = asyncio.create_task(self._watch_limits())
            t0 = time.monotonic()
            for step in plan(self.options):
                await asyncio.sleep(max(0.0, t0 + step.at - time.monotonic()))  # the plan's pace
                await self.act(step)
            await asyncio.sleep(max(0.0, t0 + self.options.duration - time.monotonic()))
            await self._quiesce()
            await self.drain()
            await asyncio.sleep(3.0)  # the slots due now are taken, then we stop
            # A data schedule still active claims a slot every second or two, each with its task
            # in the claim's transaction: pause them all, so that no slot is claimed past here,
            # and let the tasks of the slots claimed meanwhile run before the workers stop.
            for record in await self.app.schedules.list():
                if record.state != "paused":
                    await self.app.schedules.pause(record.name, reason="the end", by="fleet")
            await self.drain()
            await self._settle_cancelled()
            self.history.stopped = await self.db_now()
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
        finally:
            self.shutdown()
        return self.history

    async def _quiesce(self) -> None:
        """End every fault and pending action; finish the deploy: every worker on v2."""
        for task in list(self._background):
            with contextlib.suppress(Exception):
                await task
        for proc in self.history.backfills:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=120)
        for w in self.workers:
            w.signal(signal.SIGCONT)
            if w.version == 1 or w.proc is None or w.proc.poll() is not None:
                w.stop()
                w.version = 2
                w.start()
                await self.note("deploy", f"worker {w.index} restarted on v2 (the end)", "ok")

    async def _settle_cancelled(self) -> None:
        """A cancel gives its slot up: `verify` reports it until an operator settles it. The
        fleet's operator answers its own cancels as an operator would: skipped on purpose."""
        rows = self.rows(
            "SELECT DISTINCT job, key FROM oncely_attempts WHERE outcome = 'cancelled' AND final"
        )
        for job, key in rows:
            try:
                await self.app.skip_slot(job, key, reason="cancelled by the fleet", actor="fleet")
            except BadInputError as exc:  # released since, and ran: nothing to settle
                await self.note("skip", f"{job} {key}", f"refused: {exc}")
                continue
            await self.note("skip", f"{job} {key}", "skipped on purpose")

    async def drain(self, timeout: float = 90.0) -> None:
        """Wait (polling, with a deadline) until no task is available or running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.rows(
                "SELECT count(*) FROM oncely_tasks WHERE state IN ('available', 'running')"
            )[0][0]
            if not left:
                return
            await asyncio.sleep(0.5)

    def shutdown(self) -> None:
        for w in self.workers:
            w.stop()
        for proc in self.history.backfills:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    async def close(self) -> None:
        await self.app.aclose()
        await self.app_v2.aclose()
        self.engine.dispose()

    async def _watch_limits(self) -> None:
        """Sample the database: how many `limited` tasks (concurrency 1) hold a live lease at
        once. A limit counts live leases (docs/tasks.md): a task whose lease ran out (its
        worker stalled) frees its place while its row still reads `running` until a worker
        rescues it. The clock is read first, so a lease that runs out meanwhile still counts."""
        while True:
            for w in self.workers:  # a worker that exits on its own is a finding
                w.check_alive()
            now = await self.db_now()
            leases = self.rows(
                "SELECT lease_expires_at FROM oncely_tasks"
                " WHERE task = 'limited' AND state = 'running'"
            )
            n = sum(1 for (until,) in leases if until is not None and utc(until) > now)
            self.history.limited_max = max(self.history.limited_max, n)
            await asyncio.sleep(0.1)

    # -- actions ---------------------------------------------------------------------------

    async def act(self, step: Step) -> None:
        """Do one planned step; an error is recorded as its result, never raised."""
        handler = getattr(self, f"_do_{step.kind}")
        rng = random.Random(step.target)
        try:
            await handler(rng)
        except Exception as exc:  # an operator's refused action is a result too
            await self.note(step.kind, "", f"error: {type(exc).__name__}: {exc}".splitlines()[0])

    def _worker(self, rng: random.Random) -> Worker:
        return self.workers[rng.randrange(len(self.workers))]

    async def _enqueue(self, items: list[tuple[str, dict[str, Any], str]]) -> None:
        async with AsyncSession(self.app.store.engine) as db, db.begin():
            for name, args, key in items:
                app = self.app_v2 if name == "work_v2" or "tag" in args else self.app
                task = app.tasks.get(name)
                await task.enqueue(db, idempotency_key=key, **args)
        self.history.enqueued.update(key for _, _, key in items)

    async def _do_enqueue(self, rng: random.Random) -> None:
        items = []
        # Now and then a burst larger than the fleet's free lanes: a backlog, where a worker
        # with `--group` runs groups.
        for _ in range(rng.randint(3, 8) if rng.random() < 0.7 else rng.randint(16, 24)):
            self.counter += 1
            n = self.counter
            if self.deployed and rng.random() < 0.5:
                items.append(("work_v2", {"n": n}, f"work_v2:{n}"))
            elif self.deployed:
                items.append(("work", {"n": n, "tag": "v2"}, f"work:{n}"))
            else:
                items.append(("work", {"n": n}, f"work:{n}"))
        await self._enqueue(items)
        await self.note("enqueue", f"{len(items)} tasks", "ok")

    async def _do_enqueue_again(self, rng: random.Random) -> None:
        """Enqueue some keys again: the idempotency key makes them one task each."""
        done = sorted(k for k in self.history.enqueued if k.startswith("work:"))
        if not done:
            return await self._do_enqueue(rng)
        keys = rng.sample(done, min(3, len(done)))
        await self._enqueue([("work", {"n": int(k.split(":")[1])}, k) for k in keys])
        await self.note("enqueue_again", ", ".join(keys), "ok")

    async def _do_enqueue_limited(self, rng: random.Random) -> None:
        items = []
        for _ in range(rng.randint(2, 5)):
            self.counter += 1
            items.append(("limited", {"n": self.counter}, f"limited:{self.counter}"))
        await self._enqueue(items)
        await self.note("enqueue_limited", f"{len(items)} tasks", "ok")

    async def _do_pause(self, rng: random.Random) -> None:
        """Pause a ticking job, or resume it if it is paused."""
        job = rng.choice(("tick_all", "tick_latest"))
        pauses = await self.app.pauses()
        if job in pauses:
            done = await self.app.resume(job, actor="fleet")
            await self.note("resume", job, f"resumed at {done.resumed_at}")
        else:
            done = await self.app.pause(job, actor="fleet", reason="fleet check")
            await self.note("pause", job, f"paused at {done.paused_at}")

    async def _add_schedule(self, name: str) -> None:
        every = "1s" if name == "s1" else "2s"
        await self.app.schedules.add(
            name, every=every, task="scheduled", args={"name": name}, by="fleet"
        )
        await self.note("schedule", f"add {name} every {every}", "ok")

    async def _do_schedule(self, rng: random.Random) -> None:
        """Change a schedule kept as data, as an operator would while the workers run: add
        one, pause or resume one, change its interval, or remove one (at most once each)."""
        live = {r.name: r for r in await self.app.schedules.list()}
        gone = set(self.history.removed)
        addable = [n for n in SCHEDULES if n not in live and n not in gone]
        choices = ["toggle", "every"] if live else []
        if addable:
            choices.append("add")
        if len(live) > 1:
            choices.append("remove")
        if not choices:
            return
        what = rng.choice(choices)
        if what == "add":
            return await self._add_schedule(addable[0])
        name = rng.choice(sorted(live))
        if what == "toggle" and live[name].state == "paused":
            await self.app.schedules.resume(name, by="fleet")
            await self.note("schedule", f"resume {name}", "ok")
        elif what == "toggle":
            await self.app.schedules.pause(name, reason="fleet check", by="fleet")
            await self.note("schedule", f"pause {name}", "ok")
        elif what == "every":
            every = "2s" if live[name].every == 1 else "1s"
            await self.app.schedules.update(name, every=every, by="fleet")
            await self.note("schedule", f"update {name} every {every}", "ok")
        else:
            await self.app.schedules.remove(name, by="fleet")
            self.history.removed[name] = await self.db_now()
            await self.note("schedule", f"remove {name}", "ok")

    def _backfill(self, job: str, start: datetime, end: datetime) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oncely",
                "--app",
                APP,
                "backfill",
                job,
                "--from",
                start.isoformat(),
                "--to",
                end.isoformat(),
                "--apply",
                "--actor",
                "fleet",
                "--reason",
                "fleet check",
            ],
            cwd=ROOT,
            env={**os.environ, "ONCELY_DATABASE_URL": self.options.url},
            text=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.history.backfills.append(proc)
        return proc

    async def _backfill_range(self, rng: random.Random) -> tuple[str, datetime, datetime]:
        """A past range of a job's slots, inside the run."""
        now = await self.db_now()
        job = rng.choice(("tick_all", "tick_latest", "flaky"))
        # From the job's first appearance on (its first worker's start): a backfill of slots
        # before it would make the slots between its range and that start look expected.
        seen = self.rows("SELECT min(first_seen) FROM oncely_jobs WHERE name = :j", j=job)
        started = utc(seen[0][0]) if seen and seen[0][0] is not None else now
        started = started.replace(microsecond=0) + timedelta(seconds=1)
        end = max(now - timedelta(seconds=rng.randint(2, 15)), started + timedelta(seconds=2))
        end = min(end, now - timedelta(seconds=1))
        start = max(end - timedelta(seconds=rng.randint(3, 12)), started)
        return job, start.replace(microsecond=0), end.replace(microsecond=0)

    async def _do_backfill(self, rng: random.Random) -> None:
        job, start, end = await self._backfill_range(rng)
        if end <= start:
            return await self.note("backfill", job, "no past range yet")
        self._backfill(job, start, end)
        await self.note("backfill", f"{job} [{start.isoformat()}, {end.isoformat()})", "started")

    async def _do_backfill_twice(self, rng: random.Random) -> None:
        """Two backfills of one range at once: each slot runs once."""
        job, start, end = await self._backfill_range(rng)
        if end <= start:
            return await self.note("backfill_twice", job, "no past range yet")
        self._backfill(job, start, end)
        self._backfill(job, start, end)
        what = f"{job} [{start.isoformat()}, {end.isoformat()}) twice at once"
        await self.note("backfill_twice", what, "started")

    async def _do_release(self, rng: random.Random) -> None:
        """Release a recent claim of tick_all (the slot may then run again, by the model)."""
        rows = self.rows(
            "SELECT key FROM oncely_runs WHERE job = 'tick_all' ORDER BY scheduled_for DESC LIMIT 5"
        )
        if not rows:
            return
        key = rng.choice([r[0] for r in rows])
        claim = await self.app.release("tick_all", key, actor="fleet", reason="fleet check")
        await self.note("release", f"tick_all {key}", "released" if claim else "no claim")

    async def _do_cancel(self, rng: random.Random) -> None:
        job = rng.choice(("slow", "slow", "timeouty"))
        ids = await self.app.cancel(job, actor="fleet", reason="fleet check")
        await self.note("cancel", job, f"{len(ids)} attempts")

    async def _do_rename(self, rng: random.Random) -> None:
        """Rename a job the app still registers, without --force: the model refuses it."""
        new = f"tick_renamed_{rng.randrange(1000)}"
        try:
            moved = (await self.app.rename("tick_latest", new)).claims
        except BadInputError as exc:
            await self.note("rename", f"tick_latest -> {new}", f"refused: {exc}")
            return
        self.history.refusals_missing.append(f"rename tick_latest -> {new} moved {moved} claims")
        await self.app.rename(new, "tick_latest", force=True)  # undo, as an operator would
        await self.note("rename", f"tick_latest -> {new}", f"NOT refused (moved {moved}); undone")

    async def _do_run_future(self, rng: random.Random) -> None:
        """Run a slot a minute ahead through the API: the model refuses a slot not yet due."""
        at = await self.db_now() + timedelta(seconds=60 + rng.randint(0, 30))
        try:
            result = await self.app.attempt("tick_all", at)
        except BadInputError as exc:
            await self.note("run_future", f"tick_all {at.isoformat()}", f"refused: {exc}")
            return
        what = f"tick_all slot {at.isoformat()} ({result.status.value})"
        if result.status.value != "ran":  # refused as a status (not due), or ran before
            await self.note("run_future", f"tick_all {at.isoformat()}", f"refused: {what}")
            return
        self.history.refusals_missing.append(f"run of a future slot: {what}")
        await self.note("run_future", f"tick_all {at.isoformat()}", f"NOT refused: {what}")

    async def _do_deploy(self, rng: random.Random) -> None:
        """Restart one v1 worker on v2 (a new task argument, a new task name)."""
        old = [w for w in self.workers if w.version == 1]
        if not old:
            return await self._do_enqueue(rng)
        w = old[rng.randrange(len(old))]
        w.stop()
        w.version = 2
        w.start()
        self.deployed = True
        await self.note("deploy", f"worker {w.index} restarted on v2", w.replica)

    # -- faults ----------------------------------------------------------------------------

    def _later(self, seconds: float, then: Any) -> None:
        async def run() -> None:
            await asyncio.sleep(seconds)  # the fault's length, not a synchronisation
            then()

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _do_kill(self, rng: random.Random) -> None:
        """SIGKILL a worker, then start it again a second later."""
        w = self._worker(rng)
        w.kill()
        await self.note("kill", w.replica, "SIGKILL")
        self._later(1.0, w.start)

    async def _do_stop(self, rng: random.Random) -> None:
        """SIGSTOP a worker past its lease, then SIGCONT."""
        w = self._worker(rng)
        w.signal(signal.SIGSTOP)
        pause = self.options.lease + 1.5
        await self.note("stop", w.replica, f"SIGSTOP for {pause:g}s")
        self._later(pause, lambda: w.signal(signal.SIGCONT))

    async def _do_cut(self, rng: random.Random) -> None:
        """Cut every connection to the fleet's database but the harness's own (Postgres)."""
        name = make_url(self.options.url).database
        rows = self.rows(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = :name AND pid <> pg_backend_pid() "
            "AND application_name NOT LIKE 'fleet-harness%'",
            name=name,
        )
        for app in (self.app, self.app_v2):  # the harness's own pools were cut too
            await app.store.engine.dispose()
        await self.note("cut", f"{rows[0][0]} connections", "terminated")

    async def _do_restart(self, rng: random.Random, mode: str = "fast") -> None:
        """Restart the fleet's own Postgres cluster (never the shared server)."""
        assert self.options.restart is not None
        await asyncio.to_thread(self.options.restart, mode)
        for app in (self.app, self.app_v2):
            await app.store.engine.dispose()
        kind = "restart" if mode == "fast" else f"restart_{mode}"
        await self.note(kind, "the fleet's own cluster", f"restarted (-m {mode})")

    async def _do_restart_immediate(self, rng: random.Random) -> None:
        """Restart it with `-m immediate`: every backend killed at once, the server starting
        up (refusing connections with 57P03) while it recovers."""
        await self._do_restart(rng, "immediate")


@contextlib.contextmanager
def postgres_database(admin_url: str, name: str) -> Iterator[str]:
    """A database of the fleet's own on the server (created, then dropped)."""
    admin = sa.create_engine(sync_url(admin_url), isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield (
            make_url(admin_url)
            .set(drivername="postgresql", database=name)
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def utc(t: datetime | str) -> datetime:
    """A time read back with plain SQL (SQLite: naive UTC text) as an aware datetime."""
    if isinstance(t, str):
        t = datetime.fromisoformat(t)
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)
