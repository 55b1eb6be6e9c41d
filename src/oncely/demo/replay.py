"""Replay the incident: three replica processes, one Friday 18:00 slot, three ways.

Each replica is a real OS process, started once, that ticks once per scenario: replica A at
18:00, B at 18:01 and C at 18:02 (simulated time, America/Mexico_City). The numbers in the
final table are counted in the database after the runs, not taken from what the replicas said.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa

from ..app import Oncely
from ..errors import OncelyError
from ..schema import metadata as oncely_metadata
from ..store import mask_url
from . import leaderboard as lb
from .replica import DONE

SLOT = datetime(2026, 5, 29, 18, 0, tzinfo=lb.MEXICO_CITY)  # a Friday, ISO week 2026-W22
REPLICAS = ("replica-A", "replica-B", "replica-C")
TURN_TIMEOUT = 60.0


class DemoError(OncelyError):
    """A replica of the demo failed or hung."""


@dataclass(frozen=True)
class Scenario:
    """One way of running the leaderboard close from every replica."""

    name: str
    title: str
    section: str
    """The forum section that exists; posting the summary thread needs `general`."""
    command: str


SCENARIOS = (
    Scenario(
        "naive",
        "(a) worker loop + per-tick try-lock (the lock is released at each commit)",
        "general",
        "tick: try-lock, then `if Friday and 18:00 <= time < 18:15: close the week`, commit",
    ),
    Scenario(
        "sentinel",
        "(b) + 'skip if the summary thread exists'; the section was renamed mid-week",
        "announcements",
        "tick: try-lock, skip if the week's thread exists, close the week, commit",
    ),
    Scenario(
        "oncely",
        "(c) oncely: the same work, the same renamed section; the claim commits with the work",
        "announcements",
        "oncely run leaderboard_close --now <replica's time>",
    ),
)


@dataclass
class Tally:
    """One scenario's effects, counted in the database."""

    notifications: dict[str, int] = field(default_factory=dict)
    coins: dict[str, int] = field(default_factory=dict)
    threads: int = 0
    closed_by: list[str] = field(default_factory=list)
    """The replicas that paid the bonus: how many times the week was closed."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "notifications": self.notifications,
            "coins": self.coins,
            "threads": self.threads,
            "closed": len(self.closed_by),
            "closed_by": self.closed_by,
        }


@dataclass
class Report:
    """What the demo shows, as data (`oncely demo --json`)."""

    database: str
    path: str | None
    kept: bool
    tallies: dict[str, Tally]
    claims: int
    lines: list[tuple[str, str, str, list[str]]] = field(default_factory=list)
    """(scenario, replica, time, output lines) for each replica's turn."""

    @property
    def ok(self) -> bool:
        """Whether oncely's scenario closed the week exactly once, +10 and one notification each."""
        tally = self.tallies[lb.ONCELY_SCENARIO]
        once = {m: 1 for m in lb.TOP3}
        return (
            len(tally.closed_by) == 1
            and tally.notifications == once
            and tally.coins == {m: lb.BONUS for m in lb.TOP3}
            and self.claims == 1
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "database": self.database,
            "path": self.path,
            "kept": self.kept,
            "slot": SLOT.isoformat(),
            "key": lb.week_key(SLOT),
            "top3": list(lb.TOP3),
            "scenarios": {name: t.as_dict() for name, t in self.tallies.items()},
            "claims": self.claims,
            "ok": self.ok,
        }


def replica_time(index: int) -> datetime:
    """When replica `index` wakes up: one simulated minute after the previous one."""
    return SLOT + timedelta(minutes=index)


# -- the database -------------------------------------------------------------------------


async def prepare(app: Oncely) -> None:
    """oncely's tables, the demo's tables (fresh) and each scenario's starting data."""
    await app.migrate()
    await app.release("leaderboard_close", lb.week_key(SLOT))  # a kept earlier run's claim
    async with app.store.transaction() as conn:
        await conn.run_sync(lb.metadata.drop_all)
        await conn.run_sync(lb.metadata.create_all)
        for scenario in SCENARIOS:
            for table, rows in lb.seed_rows(
                scenario.name, lb.week_key(SLOT), section=scenario.section
            ):
                await conn.execute(table.insert(), rows)


async def tally(app: Oncely) -> tuple[dict[str, Tally], int]:
    """Count each scenario's notifications, coins, threads and closers; and oncely's claims."""
    tallies = {s.name: Tally() for s in SCENARIOS}
    async with app.store.transaction() as conn:
        for scenario, member, n in await conn.execute(
            sa.select(lb.notifications.c.scenario, lb.notifications.c.member, sa.func.count())
            .group_by(lb.notifications.c.scenario, lb.notifications.c.member)
            .order_by(lb.notifications.c.member)
        ):
            tallies[scenario].notifications[member] = int(n)
        for scenario, member, total in await conn.execute(
            sa.select(lb.coins.c.scenario, lb.coins.c.member, sa.func.sum(lb.coins.c.amount))
            .group_by(lb.coins.c.scenario, lb.coins.c.member)
            .order_by(lb.coins.c.member)
        ):
            tallies[scenario].coins[member] = int(total)
        for scenario, replica in await conn.execute(
            sa.select(lb.coins.c.scenario, lb.coins.c.replica)
            .distinct()
            .order_by(lb.coins.c.scenario, lb.coins.c.replica)
        ):
            tallies[scenario].closed_by.append(replica)
        for scenario, n in await conn.execute(
            sa.select(lb.threads.c.scenario, sa.func.count()).group_by(lb.threads.c.scenario)
        ):
            tallies[scenario].threads = int(n)
    claims = [
        c for c in await app.store.claims.history("leaderboard_close") if c.key == lb.week_key(SLOT)
    ]
    return tallies, len(claims)


async def clean(app: Oncely, *, drop_oncely_tables: bool) -> None:
    """Remove what the demo wrote to a database it did not create."""
    await app.release("leaderboard_close", lb.week_key(SLOT))
    async with app.store.transaction() as conn:
        await conn.run_sync(lb.metadata.drop_all)
        if drop_oncely_tables:
            await conn.run_sync(oncely_metadata.drop_all)


# -- the replicas -------------------------------------------------------------------------


class Replica:
    """A replica process, started now; it ticks once per `turn`, until `close`.

    `command` starts the process (see `replica.serve`); the replica's name is its argument.
    """

    def __init__(self, name: str, url: str, command: Sequence[str]) -> None:
        self.name = name
        env = {**os.environ, "ONCELY_DATABASE_URL": url}
        self.proc = subprocess.Popen(
            [*command, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        for stream, tag in ((self.proc.stdout, "out"), (self.proc.stderr, "err")):
            threading.Thread(target=self._pump, args=(stream, tag), daemon=True).start()

    def _pump(self, stream: IO[str] | None, tag: str) -> None:
        assert stream is not None
        for line in stream:
            self._lines.put((tag, line.rstrip("\n")))
        self._lines.put((tag, None))

    def turn(self, scenario: str, at: datetime) -> tuple[int, list[str]]:
        """Tick `scenario` at `at`; the exit code and the lines worth showing."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{scenario} {at.isoformat()}\n")
        self.proc.stdin.flush()
        out: list[str] = []
        err: list[str] = []
        code: int | None = None
        err_done = False
        deadline = time.monotonic() + TURN_TIMEOUT
        while code is None or not err_done:
            try:
                tag, line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise DemoError(
                    f"{self.name} did not finish its tick within {TURN_TIMEOUT:.0f}s"
                ) from None
            if line is None:
                raise DemoError(f"{self.name} exited during its tick: {' | '.join(err)}")
            if tag == "out" and line.startswith(DONE + " "):
                code = int(line.split()[1])
            elif tag == "err" and line == DONE:
                err_done = True
            else:
                (out if tag == "out" else err).append(line)
        return code, shown(out, err, failed=code != 0)

    def close(self) -> None:
        """End the process: close its stdin, and kill it if it does not exit."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


NOISE = {"slot", "claimed_at", "latency_ms", "duration_ms"}
"""Log fields left out of the demo's output (the slot is in the line above; the simulated
slot is months away from the wall clock, so its latency means nothing here)."""


def shown(out: list[str], err: list[str], *, failed: bool) -> list[str]:
    """A tick's stdout, then oncely's `run.*` log lines without their timestamp."""
    lines = [line for line in out if line.strip()]
    for line in err:
        at = line.find(" run.")
        if at >= 0:
            words = line[at + 1 :].split(" ")
            lines.append(" ".join(w for w in words if w.partition("=")[0] not in NOISE))
        elif failed:
            lines.append(line)
    return lines


@contextlib.contextmanager
def replicas(url: str, command: Sequence[str]) -> Iterator[list[Replica]]:
    """The three replica processes, started at once and ended on the way out."""
    started: list[Replica] = []
    try:
        for name in REPLICAS:
            started.append(Replica(name, url, command))
        yield started
    finally:
        for replica in started:
            replica.close()


def replay(
    procs: list[Replica], show: Callable[[str], None]
) -> list[tuple[str, str, str, list[str]]]:
    """Run each scenario on the three replicas one after the other; show each one's output."""
    turns: list[tuple[str, str, str, list[str]]] = []
    for scenario in SCENARIOS:
        show("")
        show(scenario.title)
        show(f"  each replica: {scenario.command}")
        for i, replica in enumerate(procs):
            code, lines = replica.turn(scenario.name, replica_time(i))
            when = f"{replica_time(i):%H:%M}"
            if code != 0:
                lines.append(f"(exit code {code})")
            turns.append((scenario.name, replica.name, when, lines))
            for n, line in enumerate(lines or ["(no output)"]):
                show(f"  {when + ' ' + replica.name if n == 0 else '':<16}  {line}")
    return turns


# -- the whole demo -----------------------------------------------------------------------


@contextlib.contextmanager
def database(url: str | None, keep: bool) -> Iterator[tuple[str, str | None]]:
    """The demo's database URL and its temporary directory (None for --database-url)."""
    if url is not None:
        yield url, None
        return
    directory = tempfile.mkdtemp(prefix="oncely-demo-")
    try:
        yield f"sqlite:///{Path(directory) / 'demo.db'}", directory
    finally:
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)


async def run_demo(
    url: str,
    directory: str | None,
    keep: bool,
    show: Callable[[str], None],
    replica_command: Sequence[str],
) -> Report:
    """Set up, replay the three scenarios, count the effects, and clean up unless `keep`.
    `replica_command` starts one replica process (the CLI's, which runs `oncely run`)."""
    app = Oncely(url)
    try:
        had_schema = await app.store.schema_version() is not None
        # The replicas start up while the database is prepared.
        with replicas(url, replica_command) as procs:
            await prepare(app)
            show(intro(mask_url(url), directory))
            turns = await asyncio.to_thread(replay, procs, show)
        tallies, claims = await tally(app)
        if not keep and directory is None:
            await clean(app, drop_oncely_tables=not had_schema)
    finally:
        await app.aclose()
    return Report(mask_url(url), directory, keep, tallies, claims, turns)


def intro(url: str, directory: str | None) -> str:
    where = "a temporary SQLite file" if directory else url
    return "\n".join(
        [
            "oncely demo: the Friday 18:00 leaderboard close, replayed",
            f"  slot: {SLOT:%a %d %b %Y %H:%M} America/Mexico_City (key {lb.week_key(SLOT)});"
            " 3 replica processes wake up one simulated minute apart",
            f"  top 3 of the week: {', '.join(lb.TOP3)} - each should get one notification"
            f" and +{lb.BONUS} coins",
            f"  database: {where}",
        ]
    )
