"""The two tests every job needs, as functions: deliver twice; crash between work and ack.

Each returns the deliveries plus the effect count before and after (from the `effects`
callable you pass: rows in a table, `provider.applied`), and `.assert_once()` checks the
one thing that matters: exactly one delivery took effect, and the effects moved by exactly
one. Any queue's handler can be refereed: one that is not oncely's reports no claim, so it
is judged by its effects alone, and it marks where its work ends with `crash_point()`. A
handler that is not idempotent makes `assert_once()` fail; the toolkit's own tests prove it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, overload

from .. import hooks
from ..app import Oncely
from .clock import frozen_now
from .targets import RETURNED, Delivery, JobSlot, Target

Effects = Callable[[], int | Awaitable[int]]
NO_EFFECT = frozenset({"skipped", "busy"})


class SimulatedCrash(BaseException):
    """Raised at the commit by the in-process crash: the attempt dies as a killed one would.

    A BaseException, so no handler's `except Exception` swallows it; the attempt's session is
    closed and its transaction rolled back, as the database does for a dead connection.
    """


async def _count(effects: Effects | None) -> int | None:
    if effects is None:
        return None
    value = effects()
    if inspect.isawaitable(value):
        value = await value
    return int(value)


@dataclass(frozen=True)
class Deliveries(Sequence[Delivery]):
    """The outcomes of delivering one target several times, and the effects they left."""

    deliveries: tuple[Delivery, ...]
    effects_before: int | None = None
    effects_after: int | None = None
    target: str = ""

    @overload
    def __getitem__(self, i: int) -> Delivery: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Delivery]: ...
    def __getitem__(self, i: int | slice) -> Delivery | Sequence[Delivery]:
        return self.deliveries[i]

    def __len__(self) -> int:
        return len(self.deliveries)

    def __iter__(self) -> Iterator[Delivery]:
        return iter(self.deliveries)

    @property
    def statuses(self) -> list[str]:
        """Each delivery's status, in the order they were started."""
        return [d.status for d in self.deliveries]

    @property
    def effects(self) -> int | None:
        """How many effects the deliveries left (None if no `effects` counter was given)."""
        if self.effects_before is None or self.effects_after is None:
            return None
        return self.effects_after - self.effects_before

    def assert_once(self) -> None:
        """Fail unless one effect landed: exactly one delivery ran and the rest were
        duplicates (an oncely target), or the effects you count moved by exactly one (a
        handler that is not oncely's, which reports no claim)."""
        plain = any(d.status == RETURNED for d in self.deliveries)
        problems = _by_effects(self.effects) if plain else self._by_claims()
        others = [d for d in self.deliveries if d.status not in NO_EFFECT | {"ran", RETURNED}]
        for d in others:
            problems.append(f"a delivery {d.status}: {d.error or d.exit_code}")
        keys = {d.key for d in self.deliveries if d.key is not None}
        if len(keys) > 1:
            problems.append(f"the deliveries went for different keys: {sorted(keys)}")
        if self.effects is not None and self.effects != 1:
            problems.append(f"{self.effects} effects landed (expected 1)")
        if problems:
            raise AssertionError(
                f"{self.target}: not once: " + "; ".join(problems) + f" [statuses {self.statuses}]"
            )

    def _by_claims(self) -> list[str]:
        """What oncely's own outcomes say is wrong: not exactly one `ran`."""
        problems = []
        ran = self.statuses.count("ran")
        if ran != 1:
            problems.append(f"{ran} deliveries ran (expected 1)")
        if self.statuses and all(s == "skipped" for s in self.statuses):
            problems.append(
                "every delivery found its slot or key claimed before the test: the app's "
                "database is not the one the test prepared, or its ledger was not emptied "
                "(see using_database and prepare_database)"
            )
        return problems


def _by_effects(effects: int | None) -> list[str]:
    """A handler that is not oncely's says nothing of its claims: only its effects can."""
    if effects is None:
        return [
            "the handler is not oncely's, so only its effects can say whether it took effect "
            "once: pass effects= (a function that counts them)"
        ]
    return []


@dataclass(frozen=True)
class CrashResult:
    """A delivery stopped between its work and its commit, then the retry."""

    crashed: Delivery
    retry: Delivery
    effects_before: int | None = None
    effects_at_crash: int | None = None
    effects_after: int | None = None
    target: str = ""

    @property
    def effects(self) -> int | None:
        """Effects left by the crashed delivery and the retry together."""
        if self.effects_before is None or self.effects_after is None:
            return None
        return self.effects_after - self.effects_before

    def assert_once(self) -> None:
        """Fail unless the crash happened between the work and the commit (or the handler's
        `crash_point()`), the retry ran, and one effect landed."""
        problems = []
        if self.crashed.status != "crashed":
            problems.append(
                f"the first delivery was not stopped between work and commit: it "
                f"{self.crashed.status} (the target does not commit through oncely; in a "
                "handler of your own, call crash_point() where its work ends and its ack begins)"
            )
        if self.retry.status not in ("ran", RETURNED):
            problems.append(
                f"the retry {self.retry.status} (expected ran: the crash must free the key)"
                + (f": {self.retry.error}" if self.retry.error else "")
            )
        if self.retry.status == RETURNED:
            problems += _by_effects(self.effects)
        if self.effects is not None and self.effects != 1:
            problems.append(f"{self.effects} effects landed (expected 1)")
        if problems:
            raise AssertionError(f"{self.target}: not once: " + "; ".join(problems))


def crash_point(name: str = "crash_point", key: str = "") -> None:
    """Mark, in a handler that is not oncely's, the point between its work and its ack (its
    commit, the message's delete): `crash_between_work_and_ack` stops the handler here (a
    real SIGKILL in a child process, SimulatedCrash in this one), as it stops oncely's own
    at their commit. Anywhere else it does nothing. `name` and `key` say which work it was."""
    hooks.before_commit(name, key)


# -- child processes --------------------------------------------------------------------


@dataclass
class _Child:
    proc: subprocess.Popen[bytes]
    workdir: Path
    name: str
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def out(self) -> Path:
        return self.workdir / f"{self.name}.out"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / f"{self.name}.err"

    async def wait(self, timeout: float) -> Delivery:
        code = await asyncio.to_thread(self.proc.wait, timeout)
        if self.out.exists():
            data = json.loads(self.out.read_text())
            data["exit_code"] = code
            return Delivery.from_json(data)
        tail = self.stderr_path.read_text(errors="replace").strip().splitlines()[-5:]
        return Delivery(status="failed", error=" | ".join(tail), pid=self.proc.pid, exit_code=code)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [p for p in sys.path if p and Path(p).exists()]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _spawn(
    target: Target, workdir: Path, name: str, *, barrier: bool, at_commit: bool, timeout: float
) -> _Child:
    now = frozen_now()
    spec: dict[str, Any] = {
        "target": target.to_spec(),
        "out": str(workdir / f"{name}.out"),
        "clock": now.isoformat() if now is not None else None,
        "timeout": timeout,
    }
    if barrier:
        spec["ready"] = str(workdir / f"{name}.ready")
        spec["go"] = str(workdir / "go")
    if at_commit:
        spec["at_commit"] = str(workdir / f"{name}.at-commit")
    spec_path = workdir / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    with open(workdir / f"{name}.err", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "oncely.testing._child", str(spec_path)],
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    return _Child(proc, workdir, name, spec)


async def _wait_for_file(path: Path, child: _Child, timeout: float) -> bool:
    """True once `path` exists; False if the child exited first. Raises after `timeout`."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if child.proc.poll() is not None:
            return path.exists()
        if time.monotonic() > deadline:
            child.kill()
            raise TimeoutError(f"{path.name} did not appear within {timeout}s")
        await asyncio.sleep(0.005)
    return True


async def _deliver_in_processes(
    targets: Sequence[Target], *, concurrently: bool, timeout: float
) -> list[Delivery]:
    with tempfile.TemporaryDirectory(prefix="oncely-deliver-") as tmp:
        workdir = Path(tmp)
        if not concurrently:
            results = []
            for i, target in enumerate(targets):
                child = _spawn(
                    target, workdir, f"d{i}", barrier=False, at_commit=False, timeout=timeout
                )
                results.append(await child.wait(timeout))
            return results
        children = [
            _spawn(t, workdir, f"d{i}", barrier=True, at_commit=False, timeout=timeout)
            for i, t in enumerate(targets)
        ]
        try:
            for child in children:
                await _wait_for_file(Path(child.spec["ready"]), child, timeout)
            (workdir / "go").touch()
            return [await child.wait(timeout) for child in children]
        finally:
            for child in children:
                child.kill()


# -- the public functions ---------------------------------------------------------------


async def deliver_twice(
    target: Target,
    *,
    concurrently: bool = False,
    processes: bool = False,
    effects: Effects | None = None,
    timeout: float = 60.0,
) -> Deliveries:
    """Deliver the same target twice, as an at-least-once queue does, and report both.

    Sequentially (a redelivery after the first finished) or `concurrently` (two workers got
    the same message); in this process on two connections, or in two real `processes`
    started together from a start line. `effects` counts what you care about (rows, a
    provider's `applied`) before and after.
    """
    before = await _count(effects)
    if processes:
        outcomes = await _deliver_in_processes(
            [target, target], concurrently=concurrently, timeout=timeout
        )
    elif concurrently:
        outcomes = list(await asyncio.gather(target.deliver(), target.deliver()))
    else:
        outcomes = [await target.deliver(), await target.deliver()]
    after = await _count(effects)
    return Deliveries(tuple(outcomes), before, after, target.describe())


async def crash_between_work_and_ack(
    target: Target,
    *,
    process: bool = True,
    effects: Effects | None = None,
    timeout: float = 60.0,
) -> CrashResult:
    """Run the target until its work is done, kill it before its commit, then run the retry.

    oncely's targets are stopped at their commit; a handler of your own at its
    `crash_point()` call, and judged by the `effects` you count.

    With `process=True` (the default) the target runs in a child process that the toolkit
    SIGKILLs at the commit; with `process=False` a SimulatedCrash is raised there, in this
    process. The retry runs here. `effects` is counted before, at the crash, and after.
    """
    before = await _count(effects)
    if process:
        crashed = await _crash_in_child(target, timeout)
    else:
        crashed = await _crash_in_process(target)
    at_crash = await _count(effects)
    retry = await target.deliver()
    if process and crashed.status == "crashed":
        retry = await _after_the_dead(target, retry, timeout)
    after = await _count(effects)
    return CrashResult(crashed, retry, before, at_crash, after, target.describe())


async def _after_the_dead(target: Target, retry: Delivery, timeout: float) -> Delivery:
    """The retry, once the killed child's transaction is gone. The child is dead, but its
    server session ends only when the server notices (on a loaded machine, a moment later);
    until then its open transaction still holds the slot's or key's lock, and the retry
    finds it `busy`. Nobody else holds it in a test: deliver again until it is not busy,
    within `timeout`. (A task's `busy` is its retry time, not a lock: left as it is.)"""
    if target.to_spec().get("kind") == "task":
        return retry
    deadline = time.monotonic() + timeout
    while retry.status == "busy" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        retry = await target.deliver()
    return retry


async def _crash_in_child(target: Target, timeout: float) -> Delivery:
    with tempfile.TemporaryDirectory(prefix="oncely-crash-") as tmp:
        child = _spawn(target, Path(tmp), "crash", barrier=False, at_commit=True, timeout=timeout)
        signal_file = Path(child.spec["at_commit"])
        try:
            reached = await _wait_for_file(signal_file, child, timeout)
        finally:
            if signal_file.exists():
                child.kill()
        if not reached:  # it finished without ever reaching oncely's commit
            return await child.wait(timeout)
        held = json.loads(signal_file.read_text())
        code = await asyncio.to_thread(child.proc.wait, timeout)
        return Delivery(status="crashed", key=held["key"], pid=child.proc.pid, exit_code=code)


async def _crash_in_process(target: Target) -> Delivery:
    reached: list[tuple[str, str]] = []

    def crash(job: str, key: str) -> None:
        if not reached:
            reached.append((job, key))
            raise SimulatedCrash(f"crashed between the work and the commit of {job} {key}")

    hooks.add_before_commit(crash)
    try:
        outcome = await target.deliver()
    except SimulatedCrash:
        return Delivery(status="crashed", key=reached[0][1], pid=os.getpid())
    finally:
        hooks.remove_before_commit(crash)
    return outcome


async def run_replicas(
    app: Oncely | str,
    job: str,
    n: int = 3,
    stagger: timedelta = timedelta(minutes=1),
    *,
    at: datetime | None = None,
    concurrently: bool = False,
    effects: Effects | None = None,
    timeout: float = 60.0,
) -> Deliveries:
    """N real processes fire the same slot of `job`, the i-th at `at + i * stagger`.

    The incident's shape: replicas whose loops wake a minute apart (sequential by default;
    `concurrently=True` starts them together from a start line). `at` defaults to the slot
    due now (the frozen clock's, when one is installed). Exactly one should run.
    """
    first = JobSlot(app, job, at)
    start = at if at is not None else first.app.slot(job, first.now).at
    targets = [first.at(start + i * stagger) for i in range(n)]
    before = await _count(effects)
    outcomes = await _deliver_in_processes(targets, concurrently=concurrently, timeout=timeout)
    after = await _count(effects)
    return Deliveries(tuple(outcomes), before, after, f"{n} replicas of {job}")
