"""`oncely enqueue`, `oncely tasks [show|explain|retry|discard|cancel]` and `oncely prune`:
the task queue's commands (the module is named, like its neighbours, after what it drives)."""

from __future__ import annotations

import json
import re
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import click

from ..errors import BadInputError, DatabaseUnavailableError, PayloadError
from ..model import UNRUNNABLE, TaskHistory, TaskRecord, TaskState

if TYPE_CHECKING:
    from ..app import Oncely

from . import render
from .common import EXIT_UNKNOWN, Context, handled, text_arg

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_DURATION = timedelta(weeks=5200)


def parse_duration(value: str, option: str) -> timedelta:
    """`30d`, `12h`, `90m`, `45s` or `2w` as a timedelta."""
    match = _DURATION.match(value)
    if not match:
        raise BadInputError(f"bad {option} {value!r}: use a number and a unit, e.g. 30d, 12h, 90m")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds > MAX_DURATION.total_seconds():
        raise BadInputError(f"bad {option} {value!r}: at most 100 years (5200w)")
    return timedelta(seconds=seconds)


def _refuse_constant(name: str) -> None:
    raise PayloadError(f"--json has {name}: JSON numbers must be finite")


def _payload(text: str) -> dict[str, Any]:
    text_arg(text, "--json")
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise PayloadError(f"--json is not valid JSON: {exc}") from None
    except RecursionError:
        raise PayloadError("--json is nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise PayloadError(f"--json is not usable: {exc}") from None
    if not isinstance(data, dict):
        raise PayloadError(f"--json must be an object of keyword arguments, got {text!r}")
    return data


@click.command()
@click.argument("task")
@click.option("--json", "payload", default="{}", metavar="OBJECT", help="The task's arguments.")
@click.option("--idempotency-key", metavar="KEY", help="Enqueue only if this key is new.")
@click.option("--delay", metavar="DURATION", help="Run after this long, e.g. 30s, 5m.")
@click.pass_obj
@handled
def enqueue(
    obj: Context, task: str, payload: str, idempotency_key: str | None, delay: str | None
) -> None:
    """Queue one run of TASK with the arguments in --json; print its id."""
    definition = obj.app.tasks.get(task)
    kwargs = _payload(payload)
    text_arg(idempotency_key, "--idempotency-key")
    wait = parse_duration(delay, "--delay") if delay else None
    definition.entry(kwargs, idempotency_key, None, wait)  # bad input: exit 2, nothing touched

    async def go(app: Oncely) -> tuple[TaskRecord, bool | None]:
        return await definition.enqueue_read_back(
            app.store, idempotency_key=idempotency_key, delay=wait, **kwargs
        )

    rec, landed = obj.call(go)
    if landed is None:
        render.echo(
            f"error: outcome unknown: the connection was lost during COMMIT of {rec.task} "
            f"id {rec.id} and the task could not be read back; it may or may not be queued: "
            f"check `oncely tasks --task {rec.task}` before enqueueing it again "
            "(with --idempotency-key a retry is safe)",
            err=True,
        )
        sys.exit(EXIT_UNKNOWN)
    if not landed:
        raise DatabaseUnavailableError(
            f"the connection was lost during COMMIT and task {rec.task} id {rec.id} is not "
            "in the database: it rolled back, nothing was enqueued"
        )
    if rec.duplicate:
        render.echo(
            f"duplicate {rec.task} id {rec.id}: idempotency key {rec.idempotency_key!r} "
            f"exists ({rec.state.value}); nothing enqueued"
        )
    else:
        render.echo(f"enqueued {rec.task} id {rec.id} queue {rec.queue}")


@click.group(invoke_without_command=True)
@click.option(
    "--state", type=click.Choice([s.value for s in TaskState]), help="Only tasks in this state."
)
@click.option("--task", "task_name", metavar="NAME", help="Only this task.")
@click.option(
    "--limit", default=50, show_default=True, type=click.IntRange(1, 100000), help="How many."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_context
def tasks(
    ctx: click.Context, state: str | None, task_name: str | None, limit: int, as_json: bool
) -> None:
    """Show queued tasks newest first; `tasks show ID` shows one (and its result),
    `tasks retry ID` / `tasks discard ID` change one."""
    if ctx.invoked_subcommand is not None:
        return
    _list(ctx.obj, state, task_name, limit, as_json)


@handled
def _list(
    obj: Context, state: str | None, task_name: str | None, limit: int, as_json: bool
) -> None:
    wanted = TaskState(state) if state else None
    records = obj.call(lambda app: app.list_tasks(wanted, task_name, limit))
    stranded = obj.call(lambda app: app.unrunnable_tasks()) or {}
    alone = obj.call(lambda app: app.tasks_without_worker())
    if as_json:
        click.echo(render.dumps([render.task_dict(r) for r in records]))
    else:
        headers = ["ID", "TASK", "STATE", "ATTEMPT", "RUN AT / FINISHED", "KEY", "LAST ERROR"]
        render.echo(render.table(headers, render.task_rows(records)))
    for line in _unrunnable_notes(records):
        render.echo(line, err=as_json)
    if alone is not None:
        n, oldest = alone
        render.echo(
            f"note: no worker is live, and {n} available task(s) have waited since "
            f"{render.iso(oldest)}: nothing runs them until an `oncely worker` starts",
            err=as_json,
        )
    for name, waiting in sorted(stranded.items()):
        if task_name is None or name == task_name:
            render.echo(
                f"note: {waiting} available {name!r} task(s) wait, and no live worker leases "
                f"{name!r} (no running worker registers it: a deploy not finished, or a "
                "worker of another app)",
                err=as_json,
            )


def _unrunnable_notes(records: list[TaskRecord]) -> list[str]:
    """A note per reason for the listed tasks that a worker handed back because it could not
    run them (another release enqueued them): what they wait for."""
    waiting: dict[tuple[str, str], list[int]] = {}
    for rec in records:
        error = rec.error or ""
        if rec.state is TaskState.AVAILABLE and error.startswith(UNRUNNABLE):
            why = error[len(UNRUNNABLE) :].split(" (", 1)[0]
            waiting.setdefault((rec.task, why), []).append(rec.id)
    return [
        f"note: {task!r} task(s) {', '.join(map(str, sorted(ids)))} are {why}: a worker "
        "handed them back uncounted because it cannot run them (another release enqueued "
        "them); `oncely tasks show ID` says which worker and why"
        for (task, why), ids in sorted(waiting.items())
    ]


_ACTOR = "Who does this, for the audit trail (default: user@host)."


@tasks.command("retry")
@click.argument("task_id", type=click.IntRange(1, 2**63 - 1))
@click.option("--actor", metavar="NAME", help=_ACTOR)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def retry_cmd(obj: Context, task_id: int, actor: str | None, as_json: bool) -> None:
    """Run a dead, discarded or waiting task again now, with a fresh set of attempts."""
    text_arg(actor, "--actor")
    rec = obj.call(lambda app: app.retry_task(task_id, actor=actor))
    if as_json:
        click.echo(render.dumps(render.task_dict(rec)))
        return
    render.echo(f"retrying {rec.task} id {rec.id}: available now")


@tasks.command("show")
@click.argument("task_id", type=click.IntRange(1, 2**63 - 1))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def show_cmd(obj: Context, task_id: int, as_json: bool) -> None:
    """Show one task: its fields, what it returned (once succeeded), its last error and
    every failed attempt's error (the newest 50), newest first."""

    async def read(app: Oncely) -> tuple[TaskRecord, TaskHistory]:
        return await app.task_record(task_id), await app.task_errors(task_id)

    rec, history = obj.call(read)
    if as_json:
        data = render.task_dict(rec)
        data["attempt_errors"] = render.history_list(history)
        data["attempt_errors_more"] = history.more
        click.echo(render.dumps(data))
        return
    render.echo(render.task_detail(rec))
    for line in render.history_lines(history):
        render.echo(line)


@tasks.command("discard")
@click.argument("task_id", type=click.IntRange(1, 2**63 - 1))
@click.option("--actor", metavar="NAME", help=_ACTOR)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def discard_cmd(obj: Context, task_id: int, actor: str | None, as_json: bool) -> None:
    """Discard a task that has not succeeded (a running attempt of it rolls back)."""
    text_arg(actor, "--actor")
    rec = obj.call(lambda app: app.discard_task(task_id, actor=actor))
    if as_json:
        click.echo(render.dumps(render.task_dict(rec)))
        return
    render.echo(f"discarded {rec.task} id {rec.id}")


@tasks.command("cancel")
@click.argument("task_id", type=click.IntRange(1, 2**63 - 1))
@click.option("--reason", metavar="TEXT", help="Why, for the audit trail.")
@click.option("--actor", metavar="NAME", help=_ACTOR)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def cancel_cmd(
    obj: Context, task_id: int, reason: str | None, actor: str | None, as_json: bool
) -> None:
    """Cancel a task: one not running is discarded at once; a running one is asked to stop
    (its worker rolls it back and does not retry it)."""
    text_arg(actor, "--actor")
    text_arg(reason, "--reason")
    status, rec = obj.call(lambda app: app.cancel_task(task_id, actor=actor, reason=reason))
    if as_json:
        task = render.task_dict(rec) if rec is not None else None
        click.echo(render.dumps({"id": task_id, "status": status, "task": task}))
        return
    if rec is not None:
        render.echo(f"discarded {rec.task} id {rec.id}: it had not started")
    else:
        render.echo(f"cancel requested for task {task_id}: it is running; its worker stops it")


@tasks.command("explain")
@click.argument("task_id", type=click.IntRange(1, 2**63 - 1))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def explain_cmd(obj: Context, task_id: int, as_json: bool) -> None:
    """Say where a task is and why, from its recorded state, attempts and last error."""
    rec, answer, sentence = obj.call(lambda app: app.explain_task(task_id))
    if as_json:
        data = {"answer": answer, "sentence": sentence, "task": render.task_dict(rec)}
        click.echo(render.dumps(data))
        return
    render.echo(sentence)
    render.echo(f"  answer: {answer}")
    for name, value in render.task_dict(rec).items():
        if value is not None and name != "error":
            render.echo(f"  {name}: {value}")
    if rec.error:
        render.echo("  error: " + rec.error.split("\n", 1)[0])


@click.command()
@click.option(
    "--older-than", required=True, metavar="DURATION", help="Age to keep, e.g. 30d (min 1h)."
)
@click.option("--actor", metavar="NAME", help=_ACTOR)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def prune(obj: Context, older_than: str, actor: str | None, as_json: bool) -> None:
    """Delete finished tasks, slot claims and attempt records older than --older-than.

    Claims stop slots from running twice: keep them longer than any job's catch-up window
    plus its retry horizon, or an old slot could run again.
    """
    age = parse_duration(older_than, "--older-than")
    if age < timedelta(hours=1):
        raise BadInputError(
            f"--older-than {older_than!r} is under 1h: claims that young still guard slots"
        )
    text_arg(actor, "--actor")
    counts = obj.call(lambda app: app.prune(age, actor=actor))
    if as_json:
        click.echo(render.dumps(counts))
        return
    render.echo(
        f"pruned {counts['tasks']} finished tasks and {counts['claims']} claims older than "
        f"{older_than} (and {counts['attempts']} attempt records)"
    )
