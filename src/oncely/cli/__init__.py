"""The `oncely` command: parse, call the public API, render. Exit codes:

0  ran, skipped or busy (or the command did what it was asked)
1  the job raised: its work was rolled back and the slot is free (with `run --wait`: the
   holder of a busy slot failed, or still held it when the wait ran out)
2  usage or configuration error: bad arguments, unknown job, bad --app,
   database unreachable, schema missing
3  outcome unknown: the connection was lost during COMMIT and what it wrote could not be
   read back (it may or may not have committed; `oncely history` / `oncely tasks` tell)
"""

from __future__ import annotations

import sys
import traceback
from typing import TYPE_CHECKING

import click

from .. import events, logs
from ..errors import BadInputError
from ..model import Claim, Pause, RunResult, RunStatus
from . import render

if TYPE_CHECKING:  # the app (SQLAlchemy, the drivers) is imported when a command needs it
    from ..app import Oncely

from .common import (  # the commands' shared pieces, also reachable as oncely.cli.X
    EXIT_JOB_FAILED,
    EXIT_UNKNOWN,
    LEVELS,
    Context,
    fail,
    handled,
    known_job,
    known_name,
    parse_time,
    text_arg,
)
from .common import (
    EXIT_OK as EXIT_OK,
)
from .common import (
    EXIT_USAGE as EXIT_USAGE,
)
from .common import (
    Finite as Finite,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--app",
    "app_spec",
    envvar="ONCELY_APP",
    metavar="MODULE:ATTR",
    help="Where your Oncely app lives, e.g. myproject.jobs:app [env ONCELY_APP].",
)
@click.option(
    "--database-url",
    envvar="ONCELY_DATABASE_URL",
    metavar="URL",
    help="Database to use instead of the app's own [env ONCELY_DATABASE_URL].",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(LEVELS),
    help="Level of the log events printed on stderr.",
)
@click.option(
    "--log-format",
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="Log lines as text, or as one JSON object per line (event + fields).",
)
@click.option(
    "--event-level",
    "event_levels",
    multiple=True,
    envvar="ONCELY_EVENT_LEVELS",
    metavar="EVENT=LEVEL",
    help="Log one event at another level, e.g. run.skipped=info (repeatable) "
    "[env ONCELY_EVENT_LEVELS, space-separated].",
)
@click.version_option(package_name="oncely")
@click.pass_context
def cli(
    ctx: click.Context,
    app_spec: str | None,
    database_url: str | None,
    log_level: str,
    log_format: str,
    event_levels: tuple[str, ...],
) -> None:
    """oncely: scheduled and background jobs whose effects happen once."""
    logs.configure(log_level, log_format)
    for spec in event_levels:
        event, _, level = spec.partition("=")
        if not event.strip() or level.strip().lower() not in LEVELS:
            fail(
                f"bad --event-level {spec!r}: use EVENT=LEVEL with LEVEL one of "
                f"{', '.join(LEVELS)}, e.g. run.skipped=info"
            )
        events.set_level(event.strip(), level.strip().lower())
    ctx.obj = Context(app_spec, database_url)
    ctx.call_on_close(ctx.obj.close)


@cli.command()
@click.argument("job")
@click.option(
    "--now", metavar="ISO", help="Run the slot due at this time (default: the database's now)."
)
@click.option(
    "--allow-future",
    is_flag=True,
    help="Run a --now slot that is still in the future (it is then skipped when it comes due).",
)
@click.option(
    "--wait",
    metavar="DURATION",
    help="If the slot is busy, wait up to this long (e.g. 300, 90s, 5m) for the holder's "
    "outcome and exit with it: 0 ran elsewhere, 1 failed elsewhere or still busy.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as one JSON document.")
@click.pass_obj
@handled
def run(
    obj: Context, job: str, now: str | None, allow_future: bool, wait: str | None, as_json: bool
) -> None:
    """Run the due slot of JOB once, then exit (for cron, EventBridge, Kubernetes).

    This is the caller's retry: a slot waiting for its retry policy runs now. Exit 0 when
    the slot's work is done (ran, here or before, or skipped on purpose by an operator) or
    not to be done now (paused, busy); 1 when the job failed or the slot is given up (its
    budget of attempts is spent: `oncely release` or `oncely skip` settles it).
    """
    at = parse_time(now, "--now")
    patience = parse_wait(wait)
    job = known_name(obj, job)  # unknown job: exit 2 (a code job: before the database)

    async def go(app: Oncely) -> RunResult:
        if at is not None:
            await app.refuse_future(
                job,
                at,
                allow=allow_future,
                by_database=True,
                named=f"--now {at.isoformat()}",
                hint="pass --allow-future to run it on purpose",
            )
        return await app.attempt(job, at, allow_future=True)  # refused or allowed above

    result = obj.call(go)
    if as_json:
        click.echo(render.dumps(render.run_dict(result)))
    exit_with(obj, result, patience, as_json)


def exit_with(obj: Context, result: RunResult, patience: float | None, as_json: bool) -> None:
    """Print `oncely run`'s outcome and exit with its code: non-zero whenever the slot's work
    did not happen and is not to be left alone (failed, given up, unknown)."""
    if result.status is RunStatus.UNKNOWN:
        if not as_json:
            render.echo(render.run_line(result), err=True)
        sys.exit(EXIT_UNKNOWN)
    if patience is not None and result.status is RunStatus.BUSY:
        wait_for_holder(obj, result, patience)
    if result.status in (RunStatus.FAILED, RunStatus.TIMEOUT, RunStatus.CANCELLED):
        err = result.error
        if err is not None:
            if logs.is_json():
                logs.traceback_line(err)  # one JSON object, like every other line
            else:
                text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
                render.echo(text.rstrip("\n"), err=True)
        if not as_json:
            render.echo(render.run_line(result), err=True)
        sys.exit(EXIT_JOB_FAILED)
    if result.status is RunStatus.GIVEN_UP and not result.done:
        if not as_json:
            render.echo(render.run_line(result), err=True)
        sys.exit(EXIT_JOB_FAILED)  # the work did not happen: a scheduler must see it
    if not as_json:
        render.echo(render.run_line(result))


def parse_wait(value: str | None) -> float | None:
    """`--wait`: seconds (`300`) or a number with a unit (`90s`, `5m`, `1h`); None if absent."""
    if value is None:
        return None
    from .queue import parse_duration

    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text, "--wait").total_seconds()
        except BadInputError:
            raise BadInputError(
                f"bad --wait {value!r}: use seconds or a number and a unit, e.g. 300, 90s, 5m"
            ) from None
    if not 0 < seconds < 86400 or seconds != seconds:
        raise BadInputError(f"bad --wait {value!r}: it must be more than 0 and under 24h")
    return seconds


def wait_for_holder(obj: Context, busy: RunResult, patience: float) -> None:
    """`run --wait` after BUSY: wait for the holder's outcome, print it, exit with it."""
    from ..identity import replica_id
    from ..waiting import Held
    from ..waiting import wait_for_holder as wait

    definition = obj.app.registry.job(busy.job)
    slot = busy.slot
    assert slot is not None  # a busy result always names its slot
    render.echo(render.run_line(busy), err=True)
    waited = obj.call(
        lambda app: wait(app.store, definition, slot, busy.key, replica_id(), patience)
    )
    line = render.waited_line(busy, waited)
    if waited.held is Held.RAN:
        render.echo(line)
        return
    render.echo(line, err=True)
    sys.exit(EXIT_JOB_FAILED)


@cli.command()
@click.argument("job")
@click.argument("key")
@click.option("--reason", metavar="TEXT", required=True, help="Why (required): verify shows it.")
@click.option(
    "--actor", metavar="NAME", help="Who does this, for the audit trail (default: user@host)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def skip(obj: Context, job: str, key: str, reason: str, actor: str | None, as_json: bool) -> None:
    """Settle a slot that did not run (given up, died) as skipped on purpose, with a reason:
    no replica starts it, verify accounts for it; `oncely release` undoes it."""
    text_arg(job, "job")
    text_arg(key, "key")
    text_arg(reason, "--reason")
    text_arg(actor, "--actor")
    obj.call(lambda app: app.skip_slot(job, key, reason=reason, actor=actor))
    if as_json:
        click.echo(render.dumps({"status": "skipped_on_purpose", "job": job, "key": key}))
        return
    render.echo(f"skipped {job} key {key} on purpose ({reason}); `oncely release` undoes it")


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def list_jobs(obj: Context, as_json: bool) -> None:
    """List the jobs (schedule, zone, next slot, last run) and the tasks (queue, retry, counts)."""
    app = obj.app

    async def read(
        a: Oncely,
    ) -> tuple[dict[str, Claim], dict[str, dict[str, int]], dict[str, Pause]]:
        last = await a.last_runs() if len(a.registry) else {}
        counts = await a.store.tasks.count_by_task() if len(a.tasks) else {}
        pauses = await a.pauses() if len(a.registry) else {}
        return last, counts, pauses

    last, counts, pauses = obj.call(read)
    jobs = [
        (job, app.next_slots(job.name), last.get(job.name), pauses.get(job.name))
        for job in app.registry
    ]
    tasks = [(task, counts.get(task.name, {})) for task in app.tasks]
    if as_json:
        render.echo(
            render.dumps(
                [render.job_dict(*entry) for entry in jobs]
                + [render.task_def_dict(*entry) for entry in tasks]
            )
        )
        return
    headers = ["NAME", "SCHEDULE", "ZONE", "NEXT", "LAST RUN", "STATE"]
    render.echo(render.table(headers, [render.job_row(*entry) for entry in jobs]))
    if tasks:
        render.echo()
        headers = ["TASK", "QUEUE", "RETRY", "TASKS BY STATE"]
        render.echo(render.table(headers, [render.task_def_row(*entry) for entry in tasks]))


@cli.command("next")
@click.argument("job", required=False)
@click.option(
    "-n",
    "count",
    default=1,
    show_default=True,
    type=click.IntRange(1, 10000),
    help="How many slots.",
)
@click.option("--after", metavar="ISO", help="Start after this time (default: now).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def next_slots(obj: Context, job: str | None, count: int, after: str | None, as_json: bool) -> None:
    """Print the next slot times of JOB (of every job if none), in the job's zone."""
    start = parse_time(after, "--after")
    if job is not None:
        known_job(obj.app, job)
    names = [job] if job is not None else [j.name for j in obj.app.registry]
    found = [(name, obj.app.next_slots(name, start, count)) for name in names]
    definitions = {name: obj.app.registry.job(name) for name in names}
    if as_json:
        data = [
            {"slot": render.iso(s), "key": definitions[name].key_for(s)}
            | ({} if job is not None else {"job": name})
            for name, slots in found
            for s in slots
        ]
        click.echo(render.dumps(data))
        return
    if job is not None:
        for slot in found[0][1]:
            render.echo(render.iso(slot))
        return
    rows = [[name, render.iso(s)] for name, slots in found for s in slots]
    render.echo(render.table(["JOB", "NEXT"], rows))


@cli.command()
@click.argument("job", required=False)
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 100000),
    help="How many claims.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def history(obj: Context, job: str | None, limit: int, as_json: bool) -> None:
    """Show claims newest first: who ran each slot, when, and for how long."""
    text_arg(job, "job")
    claims = obj.call(lambda app: app.history(job, limit))
    known = {j.name: j for j in obj.app.registry}
    if as_json:
        click.echo(render.dumps([render.claim_dict(c, known.get(c.job)) for c in claims]))
        return
    render.echo(
        render.table(
            ["JOB", "KEY", "SLOT", "CLAIMED BY", "CLAIMED AT", "DURATION"],
            render.history_rows(claims, known),
        )
    )


@cli.command()
@click.argument("job")
@click.argument("key")
@click.option("--force", is_flag=True, help="Release even while an attempt holds the slot.")
@click.option("--reason", metavar="TEXT", help="Why, for the audit trail.")
@click.option(
    "--actor", metavar="NAME", help="Who does this, for the audit trail (default: user@host)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
@handled
def release(
    obj: Context,
    job: str,
    key: str,
    force: bool,
    reason: str | None,
    actor: str | None,
    as_json: bool,
) -> None:
    """Free one slot so that it can run again: delete its claim, or clear the given-up mark
    of a failed, timed-out or cancelled attempt (refused while it runs)."""
    text_arg(job, "job")
    text_arg(key, "key")
    text_arg(reason, "--reason")
    text_arg(actor, "--actor")
    claim, given_up = obj.call(
        lambda app: app.release_slot(job, key, force=force, actor=actor, reason=reason)
    )
    if claim is None and given_up:
        if as_json:
            click.echo(render.dumps({"status": "released", "job": job, "key": key}))
        else:
            render.echo(f"released {job} key {key} (it had been given up)")
        return
    if claim is None and all(j.name != job for j in obj.app.registry):
        fail(
            f"unknown job {job!r}: the app has no such job, and the database no claim of it "
            f"at key {key!r}: nothing released (see `oncely list` and `oncely history`)"
        )
    if claim is None:
        fail(
            f"no claim for job {job!r} key {key!r}: nothing released "
            "(see `oncely history` for the keys)"
        )
        return
    if as_json:
        click.echo(render.dumps({"status": "released", **render.claim_dict(claim)}))
        return
    render.echo(
        f"released {job} key {key} (was claimed by {claim.claimed_by} "
        f"at {render.iso(claim.claimed_at)})"
    )


@cli.command()
@click.argument("old")
@click.argument("new")
@click.option("--force", is_flag=True, help="Rename even while OLD is still registered.")
@click.option("--reason", metavar="TEXT", help="Why, for the audit trail.")
@click.option(
    "--actor", metavar="NAME", help="Who does this, for the audit trail (default: user@host)."
)
@click.pass_obj
@handled
def rename(
    obj: Context, old: str, new: str, force: bool, reason: str | None, actor: str | None
) -> None:
    """Carry a renamed job's history from OLD to NEW (claims, pauses, given-up and skipped
    slots, releases, audit rows, first appearance), so NEW does not re-run OLD's slots.

    Run it with the release that names the job NEW, before its workers start. Refused
    (nothing changed) if OLD has no history, if NEW has one, and while OLD is still
    registered in the app, unless --force. One transaction; audited.
    """
    text_arg(old, "OLD")
    text_arg(reason, "--reason")
    text_arg(actor, "--actor")
    done = obj.call(lambda app: app.rename(old, new, force=force, actor=actor, reason=reason))
    render.echo(f"renamed {old} to {new}: {done.summary()}")


@cli.command()
@click.pass_obj
@handled
def migrate(obj: Context) -> None:
    """Create or upgrade oncely's tables (safe to run again, and from several replicas)."""
    applied = obj.call(lambda app: app.migrate())
    url = obj.app.store.display_url
    if applied:
        render.echo(f"migrated {url} to version {applied[-1]} (applied {applied})")
    else:
        render.echo(f"{url} is up to date")


# Feature commands live in their own modules (cli/<feature>.py) and register here.
from .worker import worker as _worker  # noqa: E402

cli.add_command(_worker)

from .demo import demo  # noqa: E402
from .export import export_group  # noqa: E402

cli.add_command(demo)
cli.add_command(export_group)

from .operate import audit, backfill, cancel, explain, pause, resume  # noqa: E402

for _command in (pause, resume, backfill, explain, cancel, audit):
    cli.add_command(_command)

from .web import web  # noqa: E402

cli.add_command(web)

from .verify import verify  # noqa: E402

cli.add_command(verify)

from .schedules import schedules  # noqa: E402

cli.add_command(schedules)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="oncely")


from .queue import enqueue, prune, tasks  # noqa: E402  (they import this module)

cli.add_command(enqueue)
cli.add_command(tasks)
cli.add_command(prune)
