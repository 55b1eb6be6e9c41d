"""`oncely pause | resume | backfill | explain | cancel | audit`: steering jobs in an incident.

Each command calls one `Oncely` method (the public API a dashboard calls too) and renders
its answer; `--json` prints one JSON document instead. Exit codes: 0 done, 1 a slot that a
backfill ran failed, 2 bad input or refused (nothing changed).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import click

from .. import config
from ..model import RunResult, RunStatus

if TYPE_CHECKING:
    from ..app import Oncely

from . import render
from .common import EXIT_JOB_FAILED, Context, handled, known_name, parse_time, text_arg

ACTOR_HELP = "Who does this, for the audit trail (default: user@host)."
_FAILED = (RunStatus.FAILED, RunStatus.TIMEOUT, RunStatus.CANCELLED, RunStatus.UNKNOWN)


def actor_option(func: click.decorators.FC) -> click.decorators.FC:
    """`--actor NAME`, checked like any text the database stores."""
    return click.option("--actor", metavar="NAME", help=ACTOR_HELP)(func)


def json_option(func: click.decorators.FC) -> click.decorators.FC:
    """`--json`: one JSON document on stdout."""
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")(func)


def _texts(**values: str | None) -> None:
    for name, value in values.items():
        text_arg(value, f"--{name}")


@click.command()
@click.argument("job")
@click.option("--reason", metavar="TEXT", help="Why, for the audit trail and `explain`.")
@actor_option
@json_option
@click.pass_obj
@handled
def pause(obj: Context, job: str, reason: str | None, actor: str | None, as_json: bool) -> None:
    """Stop starting JOB's slots from now on, everywhere (a running slot finishes).

    The pause covers the slots whose time is at or after it (slots before it still run);
    those that fall inside it are not caught up on resume: `backfill` runs them.
    """
    job = known_name(obj, job)
    _texts(reason=reason, actor=actor)
    done = obj.call(lambda app: app.pause(job, reason=reason, actor=actor))
    if as_json:
        click.echo(render.dumps(render.pause_dict(done)))
        return
    render.echo(f"paused {job} ({render.pause_text(done)})")


@click.command()
@click.argument("job")
@click.option("--reason", metavar="TEXT", help="Why, for the audit trail.")
@actor_option
@json_option
@click.pass_obj
@handled
def resume(obj: Context, job: str, reason: str | None, actor: str | None, as_json: bool) -> None:
    """End JOB's pause now: later slots run as usual (the paused ones are not caught up)."""
    job = known_name(obj, job)
    _texts(reason=reason, actor=actor)
    done = obj.call(lambda app: app.resume(job, reason=reason, actor=actor))
    if as_json:
        click.echo(render.dumps(render.pause_dict(done)))
        return
    render.echo(
        f"resumed {job} (paused {render.pause_text(done)}; resumed by {done.resumed_by} "
        f"at {render.iso(done.resumed_at)})"
    )


@click.command()
@click.argument("job")
@click.option("--from", "start", required=True, metavar="ISO", help="The first slot time.")
@click.option("--to", "end", required=True, metavar="ISO", help="The end (not included).")
@click.option("--apply", "apply", is_flag=True, help="Run the free slots (default: plan only).")
@click.option(
    "--max-slots",
    default=config.MAX_SLOTS,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="Refuse a range of more slots than this.",
)
@click.option(
    "--allow-future",
    is_flag=True,
    help="Run slots later than the database's clock now (audited; the real slots then skip).",
)
@click.option("--reason", metavar="TEXT", help="Why, for the audit trail.")
@actor_option
@json_option
@click.pass_obj
@handled
def backfill(
    obj: Context,
    job: str,
    start: str,
    end: str,
    apply: bool,
    max_slots: int,
    allow_future: bool,
    reason: str | None,
    actor: str | None,
    as_json: bool,
) -> None:
    """Print what running JOB's slots in [--from, --to) would do; --apply runs the free ones.

    Each slot runs as `oncely run JOB --now SLOT` would (its claim, its transaction): a slot
    that ran is skipped, so a second --apply runs nothing. A range holding a slot later than
    the database's clock is refused (exit 2, nothing ran) unless --allow-future. Ctrl-C stops
    after the current slot.
    """
    first = parse_time(start, "--from")
    last = parse_time(end, "--to")
    assert first is not None and last is not None
    job = known_name(obj, job)
    _texts(reason=reason, actor=actor)
    obj.app.backfill_slots(job, first, last, max_slots)  # bad range: exit 2 before the database
    if not apply:
        plan = obj.call(
            lambda app: app.backfill_plan(
                job, first, last, max_slots=max_slots, allow_future=allow_future
            )
        )
        if as_json:
            click.echo(render.dumps([render.planned_dict(p) for p in plan]))
            return
        render.echo(render.table(["SLOT", "KEY", "PLAN"], [render.planned_row(p) for p in plan]))
        free = sum(1 for p in plan if p.action == "would run")
        render.echo(f"{free} of {len(plan)} slots would run (nothing changed: --apply runs them)")
        ahead = sum(1 for p in plan if p.action == "not due")
        if ahead:
            render.echo(f"{ahead} slots are not due yet: --apply refuses them (--allow-future)")
        return
    options = _Apply(max_slots, allow_future, reason, actor)
    results = _apply(obj, job, first, last, options, as_json)
    if as_json:
        click.echo(render.dumps([render.run_dict(r) for r in results]))
    elif not results:
        render.echo(f"nothing to run: every slot of {job} in the range ran before (or runs now)")
    if any(r.status in _FAILED for r in results):
        sys.exit(EXIT_JOB_FAILED)


@dataclass(frozen=True)
class _Apply:
    max_slots: int
    allow_future: bool
    reason: str | None
    actor: str | None


def _apply(
    obj: Context, job: str, first: datetime, last: datetime, options: _Apply, as_json: bool
) -> list[RunResult]:
    def show(result: RunResult) -> None:
        if not as_json:
            failed = result.status in _FAILED
            render.echo(render.run_line(result), err=failed)

    import asyncio

    async def go(app: Oncely) -> list[RunResult]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, stop.set)
        try:
            return await app.backfill(
                job,
                first,
                last,
                max_slots=options.max_slots,
                actor=options.actor,
                reason=options.reason,
                stop=stop,
                on_result=show,
                allow_future=options.allow_future,
            )
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)

    return obj.call(go)


@click.command()
@click.argument("job")
@click.option("--slot", metavar="ISO", help="The slot to explain (default: the latest due).")
@json_option
@click.pass_obj
@handled
def explain(obj: Context, job: str, slot: str | None, as_json: bool) -> None:
    """Say why a slot of JOB ran or did not, from what the database recorded."""
    at = parse_time(slot, "--slot")
    job = known_name(obj, job)
    answer = obj.call(lambda app: app.explain(job, at))
    if as_json:
        click.echo(render.dumps(render.explanation_dict(answer)))
        return
    render.echo("\n".join(render.explanation_lines(answer)))


@click.command()
@click.argument("job")
@click.option("--slot", metavar="ISO", help="Only the attempt at this slot (default: any).")
@click.option("--reason", metavar="TEXT", help="Why, for the audit trail.")
@actor_option
@json_option
@click.pass_obj
@handled
def cancel(
    obj: Context,
    job: str,
    slot: str | None,
    reason: str | None,
    actor: str | None,
    as_json: bool,
) -> None:
    """Stop JOB's running attempt in whatever process runs it (it rolls back, the slot is
    free); the process notices within seconds."""
    at = parse_time(slot, "--slot")
    job = known_name(obj, job)
    _texts(reason=reason, actor=actor)
    asked = obj.call(lambda app: app.cancel(job, at, actor=actor, reason=reason))
    if as_json:
        click.echo(render.dumps({"job": job, "status": "cancel requested", "attempts": asked}))
        return
    ids = ", ".join(str(i) for i in asked)
    render.echo(f"cancel requested for {job} (attempt {ids}): it rolls back when it notices")


@click.command()
@click.option("--job", metavar="NAME", help="Only this job's actions.")
@click.option(
    "--limit", default=50, show_default=True, type=click.IntRange(1, 100000), help="How many."
)
@json_option
@click.pass_obj
@handled
def audit(obj: Context, job: str | None, limit: int, as_json: bool) -> None:
    """List the operators' actions newest first: when, who, what, on what, with what result."""
    text_arg(job, "--job")
    entries = obj.call(lambda app: app.audit(job, limit))
    if as_json:
        click.echo(render.dumps([render.audit_dict(e) for e in entries]))
        return
    headers = ["AT", "ACTOR", "ACTION", "TARGET", "RESULT", "REASON"]
    render.echo(render.table(headers, [render.audit_row(e) for e in entries]))
