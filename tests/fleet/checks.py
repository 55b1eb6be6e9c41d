"""Check a fleet run against the fate model, Chronos-style: for each expected slot, was it
missed or run more than once; for each task, was its effect lost or doubled.

The checks, each pass or fail with its evidence:

- `verify`: `oncely verify --json` over the run (every expected slot has one recorded fate;
  no rerun of a given-up slot, no claim before its slot was due, no stale key);
- `job effects once`: each claim has exactly one effect row; no slot's effect more than
  once (plus once more per release of that slot); no effect without a claim;
- `paused slots`: no worker ran a slot whose time lies inside a pause;
- `refusals`: what the model refuses was refused (a rename of a registered job without
  --force, a slot not yet due through the API);
- `task effects once`: each enqueued idempotency key took effect exactly once;
- `workers started`: every worker logged its start in some incarnation;
- `workers that died`: no worker process exited on its own during the run (only the
  harness's stops and SIGKILLs end one): an outage, a restart of the server, a cut
  connection are waited out, never a reason to exit;
- `grouped tasks`: the workers started with `--group` (the odd-numbered ones, on Postgres)
  ran tasks in groups, so that the check above covered groups under the same faults;
- `older releases burn nothing`: no task attempt failed because the worker that leased it
  could not run it (an older release: an unknown name or arguments its function does not
  take): such a task is handed back uncounted, by the model;
- `concurrency`: a concurrency-1 task never ran twice at once in the database;
- `schedules as data`: each claimed slot of a schedule kept as data enqueued exactly one
  task (idempotency key: ledger name and slot key) and took effect exactly once; no task
  without its claim; no slot of a removed schedule claimed after its removal (its slots
  inside a pause are the `paused slots` check's, as for code jobs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tests.fleet.harness import APP, FAULTS, JOBS, ROOT, Fleet, History, utc


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    """The checks of one run and its counts."""

    checks: list[Check] = field(default_factory=list)
    slots: int = 0
    tasks: int = 0
    actions: int = 0
    faults: int = 0
    lost: int = 0
    doubled: int = 0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def summary(self) -> str:
        verdict = "ok" if self.ok else f"FAILED: {', '.join(c.name for c in self.failed())}"
        return (
            f"fleet: slots {self.slots}, tasks {self.tasks}, actions {self.actions}, "
            f"faults {self.faults}, lost {self.lost}, doubled {self.doubled}: {verdict}"
        )

    def lines(self) -> list[str]:
        return [f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in self.checks]


def _sample(items: list[str], n: int = 5) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return "; ".join(items[:n]) + more


def run_verify(fleet: Fleet, history: History) -> tuple[int, dict[str, Any]]:
    """`oncely verify --json` over the run, as an operator runs it."""
    assert history.started is not None and history.stopped is not None
    until = history.stopped - timedelta(seconds=2)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "oncely",
            "--app",
            APP,
            "verify",
            "--json",
            "--leeway",
            "0",
            "--since",
            history.started.isoformat(),
            "--until",
            until.isoformat(),
            *JOBS,
        ],
        cwd=ROOT,
        env={**os.environ, "ONCELY_DATABASE_URL": fleet.options.url, "ONCELY_FLEET_VERSION": "2"},
        text=True,
        capture_output=True,
        timeout=120,
    )
    if done.returncode not in (0, 1):
        raise AssertionError(f"oncely verify exited {done.returncode}: {done.stderr}")
    answer: dict[str, Any] = json.loads(done.stdout)
    (fleet.options.run_dir / "verify.json").write_text(done.stdout)  # every slot and finding
    ended = fleet.rows(
        "SELECT job, slot, outcome, replica, error_class, error FROM oncely_attempts "
        "WHERE outcome IN ('failed', 'timeout', 'cancelled') ORDER BY id"
    )
    (fleet.options.run_dir / "attempts.txt").write_text(
        "".join(f"{j} {utc(t).isoformat()} {o} by {r}: {c}: {e}\n" for j, t, o, r, c, e in ended)
    )
    return done.returncode, answer


def check(fleet: Fleet, history: History) -> Report:
    """Every check of one finished run."""
    report = Report(tasks=len(history.enqueued))
    faults = tuple(FAULTS)
    report.faults = history.count(faults)
    report.actions = len(history.entries) - report.faults
    _verify(fleet, history, report)
    _job_effects(fleet, report)
    _paused(fleet, history, report)
    missing = history.refusals_missing
    report.checks.append(
        Check("refusals", not missing, _sample(missing) if missing else "all refused")
    )
    _task_effects(fleet, history, report)
    _schedules(fleet, history, report)
    _workers(fleet, report)
    _on_time(fleet, report)
    died = history.died
    detail = _sample(died, 3) if died else "none: every exit was the harness's stop or kill"
    report.checks.append(Check("workers that died", not died, detail))
    _groups(fleet, report)
    _burnt(fleet, report)
    seen = {name for (name,) in fleet.rows("SELECT name FROM oncely_jobs")}
    absent = sorted(set(JOBS) - seen)
    report.checks.append(
        Check("first appearances", not absent, f"not recorded: {absent}" if absent else "all jobs")
    )
    n = history.limited_max
    report.checks.append(Check("concurrency", n <= 1, f"at most {n} of `limited` (limit 1)"))
    return report


def _verify(fleet: Fleet, history: History, report: Report) -> None:
    code, answer = run_verify(fleet, history)
    counts: Counter[str] = Counter()
    for job in answer["jobs"]:
        counts.update(job["counts"])
    report.slots = sum(n for fate, n in counts.items() if fate not in ("before_job", "not_due"))
    kinds = Counter(f["kind"] for f in answer["findings"])
    report.lost += kinds["unaccounted"] + kinds["died"]
    report.doubled += kinds["doubled"] + kinds["rerun"]
    fates = ", ".join(f"{n} {fate}" for fate, n in counts.most_common())
    detail = f"exit {code}; {fates}"
    if kinds:
        found = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
        detail += f"; findings: {found}; " + _sample([f["message"] for f in answer["findings"]])
    report.checks.append(Check("verify", code == 0, detail))


def _job_effects(fleet: Fleet, report: Report) -> None:
    effects: Counter[tuple[str, datetime]] = Counter()
    for job, slot, n in fleet.rows(
        "SELECT job, slot, count(*) FROM fleet_job_effects GROUP BY 1, 2"
    ):
        effects[(job, utc(datetime.fromisoformat(slot)))] += int(n)
    claims = {
        (job, utc(slot))
        for job, slot in fleet.rows(
            "SELECT job, scheduled_for FROM oncely_runs WHERE job NOT LIKE 'schedule:%'"
        )
        if slot is not None
    }
    releases: Counter[tuple[str, str]] = Counter()
    for job, target in fleet.rows(
        "SELECT job, target FROM oncely_audit WHERE action = 'release' AND result LIKE 'released%'"
    ):
        releases[(job, target[len(job) + 1 :])] += 1
    lost = sorted(f"{j} {s.isoformat()}" for j, s in claims if effects[(j, s)] == 0)
    doubled, unclaimed = [], []
    for (job, slot), n in sorted(effects.items()):
        key = fleet.app_v2.registry.job(job).key_for(slot)
        allowed = 1 + releases[(job, key)]
        if n > allowed:
            doubled.append(f"{job} {slot.isoformat()} x{n}")
        if (job, slot) not in claims and not releases[(job, key)]:
            unclaimed.append(f"{job} {slot.isoformat()}")
    report.lost += len(lost)
    report.doubled += len(doubled) + len(unclaimed)
    ok = not (lost or doubled or unclaimed)
    detail = (
        f"{len(claims)} claims, {sum(effects.values())} effects; lost {len(lost)}, "
        f"doubled {len(doubled)}, without a claim {len(unclaimed)}"
    )
    if not ok:
        detail += ": " + _sample(lost + doubled + unclaimed)
    report.checks.append(Check("job effects once", ok, detail))


def _paused(fleet: Fleet, history: History, report: Report) -> None:
    pauses = fleet.rows("SELECT job, paused_at, resumed_at FROM oncely_pauses")
    runs = fleet.rows(
        "SELECT job, scheduled_for, claimed_by FROM oncely_runs WHERE claimed_by LIKE 'fleet-w%'"
    )
    bad = []
    for job, paused_at, resumed_at in pauses:
        start = utc(paused_at)
        end = utc(resumed_at) if resumed_at is not None else None
        for rjob, slot, by in runs:
            if rjob != job or slot is None:
                continue
            t = utc(slot)
            if start <= t and (end is None or t < end):
                bad.append(f"{job} {t.isoformat()} by {by} (paused {start.isoformat()})")
    detail = f"{len(pauses)} pauses; {len(bad)} slots inside one run by a worker"
    if bad:
        detail += ": " + _sample(sorted(bad))
    report.checks.append(Check("paused slots", not bad, detail))


def _task_effects(fleet: Fleet, history: History, report: Report) -> None:
    effects = Counter(
        {
            k: int(n)
            for k, n in fleet.rows("SELECT key, count(*) FROM fleet_task_effects GROUP BY key")
        }
    )
    lost = sorted(k for k in history.enqueued if effects[k] == 0)
    doubled = sorted(f"{k} x{effects[k]}" for k in history.enqueued if effects[k] > 1)
    states = Counter(
        {s: int(n) for s, n in fleet.rows("SELECT state, count(*) FROM oncely_tasks GROUP BY 1")}
    )
    report.lost += len(lost)
    report.doubled += len(doubled)
    detail = (
        f"{len(history.enqueued)} enqueued ({', '.join(f'{n} {s}' for s, n in states.items())}); "
        f"lost {len(lost)}, doubled {len(doubled)}"
    )
    if lost or doubled:
        detail += ": " + _sample(lost + doubled)
        why = fleet.rows(
            "SELECT task, state, attempt, error FROM oncely_tasks WHERE state <> 'succeeded' "
            "ORDER BY id LIMIT 3"
        )
        detail += " | e.g. " + "; ".join(
            f"{t} {s} after {a} attempts: {(e or '').splitlines()[0][:120] if e else '-'}"
            for t, s, a, e in why
        )
    report.checks.append(Check("task effects once", not (lost or doubled), detail))


def _workers(fleet: Fleet, report: Report) -> None:
    """That every worker of the fleet served (logged `worker.started` in some incarnation):
    a worker that cannot start leaves the others to do its work, and every other check
    would pass without it."""
    silent = [
        f"w{w.index}"
        for w in fleet.workers
        if not any(
            "worker.started" in log.read_text(errors="replace")
            for log in fleet.options.run_dir.glob(f"fleet-w{w.index}-*.log")
        )
    ]
    detail = f"never started: {', '.join(silent)}" if silent else f"all {len(fleet.workers)}"
    report.checks.append(Check("workers started", not silent, detail))


def _on_time(fleet: Fleet, report: Report) -> None:
    """That no slot was claimed before its time by the database's clock (the claim's
    `claimed_at` is the database's time; a worker's clock is corrected to it)."""
    early = fleet.rows(
        "SELECT job, key, scheduled_for, claimed_at FROM oncely_runs "
        "WHERE scheduled_for IS NOT NULL AND claimed_at < scheduled_for ORDER BY claimed_at"
    )
    shown = [f"{j} {k} claimed at {utc(c).isoformat()}" for j, k, _, c in early]
    detail = _sample(shown) if shown else "every claim at or after its slot's time"
    report.checks.append(Check("claimed on time", not early, detail))


def _groups(fleet: Fleet, report: Report) -> None:
    """That the workers with `--group` did run tasks in groups (their `task.started` lines
    say `grouped=True`), so that `task effects once` covered groups under the same faults."""
    grouped = [w for w in fleet.workers if w.grouped]
    if not grouped:
        return
    logs = fleet.options.run_dir.glob("fleet-w*.log")
    names = {f"fleet-w{w.index}-" for w in grouped}
    starts = sum(
        line.count("grouped=True")
        for log in logs
        if any(log.name.startswith(n) for n in names)
        for line in log.read_text(errors="replace").splitlines()
        if "task.started" in line
    )
    workers = ", ".join(f"w{w.index}" for w in grouped)
    detail = f"{starts} task attempts started in groups of up to {fleet.options.group} on {workers}"
    report.checks.append(Check("grouped tasks", starts > 0, detail))


def _schedules(fleet: Fleet, history: History, report: Report) -> None:
    claims = fleet.rows(
        "SELECT job, key, claimed_at FROM oncely_runs WHERE job LIKE 'schedule:%' ORDER BY 1, 2"
    )
    tasks = Counter(
        key
        for (key,) in fleet.rows(
            "SELECT idempotency_key FROM oncely_tasks WHERE idempotency_key LIKE 'schedule:%'"
        )
    )
    effects = Counter(
        {
            name: int(n)
            for name, n in fleet.rows(
                "SELECT key, count(*) FROM fleet_task_effects WHERE task = 'scheduled' GROUP BY key"
            )
        }
    )
    expected = {f"{job}:{key}" for job, key, _at in claims}
    per_schedule = Counter(job.split(":", 1)[1] for job, _key, _at in claims)
    without_task = sorted(k for k in expected if tasks[k] == 0)
    twice = sorted(f"{k} x{n}" for k, n in tasks.items() if n > 1)
    without_claim = sorted(k for k in tasks if k not in expected)
    counts = sorted(
        f"{name}: {effects[name]} effects for {per_schedule[name]} claimed slots"
        for name in set(per_schedule) | set(effects)
        if effects[name] != per_schedule[name]
    )
    after_removal = sorted(
        f"{job} {key} claimed {utc(at).isoformat()}"
        for job, key, at in claims
        if (gone := history.removed.get(job.split(":", 1)[1])) and utc(at) > gone
    )
    report.lost += len(without_task) + sum(
        max(0, per_schedule[n] - effects[n]) for n in per_schedule
    )
    report.doubled += len(twice) + len(without_claim) + len(after_removal)
    report.doubled += sum(max(0, effects[n] - per_schedule[n]) for n in effects)
    bad = without_task + twice + without_claim + counts + after_removal
    actions = Counter(e.what.split()[0] for e in history.entries if e.kind == "schedule")
    detail = (
        f"{len(per_schedule)} schedules, {len(claims)} slots claimed, "
        f"{sum(effects.values())} effects; actions: "
        + (", ".join(f"{n} {a}" for a, n in sorted(actions.items())) or "none")
    )
    if bad:
        detail += "; " + _sample(bad)
    report.checks.append(Check("schedules as data", not bad, detail))


_CANNOT_RUN = ("TypeError", "unexpected keyword", "UnknownTask", "no task named")


def _burnt(fleet: Fleet, report: Report) -> None:
    rows = fleet.rows(
        "SELECT t.task, e.attempt, e.by, e.error FROM oncely_task_errors e "
        "JOIN oncely_tasks t ON t.id = e.task_id ORDER BY e.id"
    )
    burnt = [
        f"{task} attempt {attempt} by {by}: {(error or '').splitlines()[0][:100]}"
        for task, attempt, by, error in rows
        if any(word in (error or "") for word in _CANNOT_RUN)
    ]
    detail = f"{len(rows)} failed task attempts; {len(burnt)} by a worker that could not run it"
    if burnt:
        detail += ": " + _sample(burnt, 3)
    report.checks.append(Check("older releases burn nothing", not burnt, detail))
