"""`oncely schedules`: add, list, show, pause, resume, remove and run schedules kept as data.

Each command calls `app.schedules`; every change is audited (its actor: `--actor`, else
user@host). Bad input (a bad cron, an unknown zone or target, arguments that do not bind, a
taken name, no such schedule) is one line on stderr and exit 2, with nothing changed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from ..errors import ScheduleError
from ..model import RunStatus, ScheduleRecord
from . import render
from .common import EXIT_JOB_FAILED, Context, handled, text_arg

if TYPE_CHECKING:
    from ..app import Oncely

ACTOR_HELP = "Who does it, for the audit trail (default: user@host)."


def _json_args(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    text_arg(text, "--args")

    def refuse(name: str) -> None:
        raise ScheduleError(f"--args has {name}: JSON numbers must be finite")

    try:
        data = json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise ScheduleError(f"--args is not valid JSON: {exc}") from None
    except RecursionError:
        raise ScheduleError("--args is nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise ScheduleError(f"--args is not usable: {exc}") from None
    if not isinstance(data, dict):
        raise ScheduleError(f"--args must be a JSON object of keyword arguments, got {text!r:.80}")
    return data


def as_dict(rec: ScheduleRecord, last: Any = None) -> dict[str, Any]:
    """A schedule as `list --json` and `show --json` print it."""
    from ..schedules import describe

    data: dict[str, Any] = {
        "name": rec.name,
        "state": rec.state,
        "expression": rec.expression,
        "description": describe(rec),
        "cron": rec.cron,
        "every": rec.every,
        "tz": rec.tz,
        "target_kind": rec.target_kind,
        "target": rec.target,
        "args": rec.args,
        "catch_up": rec.catch_up,
        "grace": rec.grace,
        "overlap": rec.overlap,
        "timeout": rec.timeout,
        "pause_reason": rec.pause_reason,
        "next_slot": render.iso(rec.next_slot) if rec.next_slot else None,
        "ledger_name": rec.ledger_name,
        "version": rec.version,
        "created_at": render.iso(rec.created_at),
        "changed_at": render.iso(rec.changed_at),
        "changed_by": rec.changed_by,
    }
    if last is not None:
        data["last_run"] = {"key": last.key, "claimed_at": render.iso(last.claimed_at)}
    return data


def _line(rec: ScheduleRecord) -> str:
    return f"{rec.name}: {rec.state}, {_when(rec)}, runs {rec.target_kind} {rec.target}"


def _when(rec: ScheduleRecord) -> str:
    from ..schedules import describe

    return describe(rec)


@click.group("schedules")
def schedules() -> None:
    """Schedules kept as data: add, change and remove them at runtime (every worker reads
    them within a second, without a restart; each slot is claimed once, as a job's)."""


def _text(value: str | None, what: str) -> str | None:
    return text_arg(value, what)


@schedules.command("add")
@click.argument("name")
@click.option("--cron", "expr", metavar="EXPR", help="A 5-field cron expression (in --tz).")
@click.option("--every", metavar="DURATION", help="An interval: 2s, 15m, 1h, 1d.")
@click.option("--tz", default="UTC", show_default=True, metavar="ZONE", help="An IANA zone.")
@click.option("--task", metavar="TASK", help="Enqueue this registered task at each slot.")
@click.option("--job", metavar="JOB", help="Call this registered job at each slot.")
@click.option("--args", "args_json", metavar="JSON", help="The target's keyword arguments.")
@click.option(
    "--catch-up",
    type=click.Choice(["latest", "all", "none"]),
    default="latest",
    show_default=True,
    help="Which missed slots a worker runs.",
)
@click.option("--paused", is_flag=True, help="Add it paused.")
@click.option("--actor", metavar="NAME", help=ACTOR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def add_cmd(
    obj: Context,
    name: str,
    expr: str | None,
    every: str | None,
    tz: str,
    task: str | None,
    job: str | None,
    args_json: str | None,
    catch_up: str,
    paused: bool,
    actor: str | None,
    as_json: bool,
) -> None:
    """Add schedule NAME: (--cron EXPR | --every DURATION) [--tz ZONE] (--task T | --job J)."""
    for value, what in ((name, "NAME"), (expr, "--cron"), (tz, "--tz"), (actor, "--actor")):
        _text(value, what)
    args = _json_args(args_json)
    if every is not None and not every.strip():
        raise ScheduleError("--every needs a duration, e.g. 2s, 15m, 1h")
    obj.app.schedules.check_new_name(name)  # a code job's name: exit 2 before the database

    async def go(app: Oncely) -> ScheduleRecord:
        return await app.schedules.add(
            name,
            cron=expr,
            every=every,
            tz=tz,
            task=task,
            job=job,
            args=args,
            catch_up=catch_up,
            paused=paused,
            by=actor,
        )

    rec = obj.call(go)
    if as_json:
        click.echo(render.dumps(as_dict(rec)))
        return
    render.echo(f"added {_line(rec)}; next slot {render.iso(rec.next_slot)}")


@schedules.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def list_cmd(obj: Context, as_json: bool) -> None:
    """List the schedules, by name, with their state and next slot."""

    async def go(app: Oncely) -> tuple[list[ScheduleRecord], dict[str, Any]]:
        return await app.schedules.list(), await app.schedules.last_runs()

    records, last = obj.call(go)
    if as_json:
        click.echo(render.dumps([as_dict(r, last.get(r.name)) for r in records]))
        return
    if not records:
        render.echo("no schedules")
        return
    rows = [
        [
            r.name,
            r.state,
            _when(r),
            f"{r.target_kind} {r.target}",
            render.iso(r.next_slot) if r.next_slot else "-",
            render.iso(last[r.name].claimed_at) if r.name in last else "-",
        ]
        for r in records
    ]
    render.echo(render.table(["NAME", "STATE", "WHEN", "RUNS", "NEXT", "LAST RUN"], rows))


@schedules.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def show_cmd(obj: Context, name: str, as_json: bool) -> None:
    """Show one schedule."""
    _text(name, "NAME")

    async def go(app: Oncely) -> tuple[ScheduleRecord, Any]:
        rec = await app.schedules.get(name)
        return rec, (await app.schedules.last_runs()).get(rec.name)

    rec, last = obj.call(go)
    data = as_dict(rec, last)
    if as_json:
        click.echo(render.dumps(data))
        return
    for key, value in data.items():
        shown = json.dumps(value) if isinstance(value, (dict, list)) else value
        render.echo(f"{key}: {'-' if shown is None else shown}")


@schedules.command("pause")
@click.argument("name")
@click.option("--reason", metavar="TEXT", help="Why, for the audit trail.")
@click.option("--actor", metavar="NAME", help=ACTOR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def pause_cmd(
    obj: Context, name: str, reason: str | None, actor: str | None, as_json: bool
) -> None:
    """Stop starting NAME's slots, on every replica (a running slot finishes)."""
    for value, what in ((name, "NAME"), (reason, "--reason"), (actor, "--actor")):
        _text(value, what)
    rec = obj.call(lambda app: app.schedules.pause(name, reason=reason, by=actor))
    _done(rec, "paused", as_json)


@schedules.command("resume")
@click.argument("name")
@click.option("--actor", metavar="NAME", help=ACTOR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def resume_cmd(obj: Context, name: str, actor: str | None, as_json: bool) -> None:
    """Start NAME's slots again from its next slot (the paused ones are not caught up)."""
    for value, what in ((name, "NAME"), (actor, "--actor")):
        _text(value, what)
    rec = obj.call(lambda app: app.schedules.resume(name, by=actor))
    _done(rec, "resumed", as_json)


@schedules.command("remove")
@click.argument("name")
@click.option("--actor", metavar="NAME", help=ACTOR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def remove_cmd(obj: Context, name: str, actor: str | None, as_json: bool) -> None:
    """Delete NAME: no slot of it starts from then on (its history stays in the ledger)."""
    for value, what in ((name, "NAME"), (actor, "--actor")):
        _text(value, what)
    obj.call(lambda app: app.schedules.remove(name, by=actor))
    if as_json:
        click.echo(render.dumps({"name": name, "status": "removed"}))
        return
    render.echo(f"removed {name}")


@schedules.command("run")
@click.argument("name")
@click.option("--actor", metavar="NAME", help=ACTOR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def run_cmd(obj: Context, name: str, actor: str | None, as_json: bool) -> None:
    """Run NAME's latest due slot now, once (a slot that ran is skipped); exit 1 if it failed."""
    for value, what in ((name, "NAME"), (actor, "--actor")):
        _text(value, what)
    result = obj.call(lambda app: app.schedules.run_due(name, by=actor))
    if as_json:
        click.echo(
            render.dumps(
                {"name": name, "job": result.job, "key": result.key, "status": result.status.value}
            )
        )
    else:
        render.echo(f"{result.job} {result.key}: {result.status.value}")
    if result.status in (RunStatus.FAILED, RunStatus.TIMEOUT, RunStatus.CANCELLED):
        raise SystemExit(EXIT_JOB_FAILED)


def _done(rec: ScheduleRecord, what: str, as_json: bool) -> None:
    if as_json:
        click.echo(render.dumps(as_dict(rec)))
        return
    render.echo(f"{what} {_line(rec)}")
