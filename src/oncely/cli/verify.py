"""`oncely verify`: is every expected slot accounted for, by the fate model?

Calls `Oncely.verify` and renders its verdict: one summary line per job, then each finding
(`--all`: each slot with its fate too); `--json` prints one JSON document. Exit codes: 0
everything accounted for, 1 findings, 2 bad input (nothing read).
"""

from __future__ import annotations

import sys
from datetime import timedelta

import click

from ..fates import SETTLE, SlotFate, Verdict
from . import render
from .common import EXIT_JOB_FAILED, Context, Finite, handled, known_name, parse_time


def _slot_line(job: str, s: SlotFate) -> str:
    when = s.slot.isoformat(timespec="seconds")
    parts = [f"  {job} {when} {s.fate}"]
    if s.by:
        parts.append(f"by {s.by}")
    if s.at is not None:
        parts.append(f"at {s.at.isoformat(timespec='seconds')}")
    if s.detail:
        parts.append(f"({s.detail})")
    return " ".join(parts)


def verdict_lines(verdict: Verdict, every_slot: bool = False) -> list[str]:
    """The verdict as text: the window, one line per job, its slots (`every_slot`), the
    findings."""
    window = (
        f"slots from {verdict.since.isoformat(timespec='seconds')} to "
        f"{verdict.until.isoformat(timespec='seconds')} (database now "
        f"{verdict.now.isoformat(timespec='seconds')})"
    )
    lines = [window]
    for j in verdict.jobs:
        lines.append(j.summary())
        if every_slot:
            lines.extend(_slot_line(j.job, s) for s in j.slots)
    findings = verdict.all_findings
    if findings:
        lines.append(f"{len(findings)} finding{'s' if len(findings) != 1 else ''}:")
        lines.extend(f"  [{f.kind}] {f.message}" for f in findings)
    else:
        lines.append("every expected slot and task is accounted for")
    return lines


@click.command()
@click.argument("jobs", nargs=-1, metavar="[JOB]...")
@click.option(
    "--since",
    metavar="ISO",
    help="Check slots from this time (default: 24 hours ago, or the job's first appearance).",
)
@click.option("--until", metavar="ISO", help="Check slots up to this time (default: now).")
@click.option(
    "--settle",
    type=Finite(),
    default=SETTLE.total_seconds(),
    show_default=True,
    metavar="SECONDS",
    help="A slot due this recently and not yet taken is `due`, not a finding.",
)
@click.option("--all", "every_slot", is_flag=True, help="List every slot with its fate.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def verify(
    obj: Context,
    jobs: tuple[str, ...],
    since: str | None,
    until: str | None,
    settle: float,
    every_slot: bool,
    as_json: bool,
) -> None:
    """Check that every expected slot of each JOB (default: all) ran once or was skipped for
    a recorded reason, and that no waiting task lacks a worker that can run it.

    Exit code 0: everything accounted for; 1: findings (listed); 2: bad input.
    """
    start = parse_time(since, "--since")
    end = parse_time(until, "--until")
    names = [known_name(obj, job) for job in jobs]
    verdict = obj.call(
        lambda app: app.verify(
            names or None, since=start, until=end, settle=timedelta(seconds=settle)
        )
    )
    if as_json:
        click.echo(render.dumps(verdict.as_json()))
    else:
        render.echo("\n".join(verdict_lines(verdict, every_slot)))
    if not verdict.ok:
        sys.exit(EXIT_JOB_FAILED)
