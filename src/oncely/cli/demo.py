"""`oncely demo`: replay the incident oncely exists for, then show the before/after table."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from . import render
from .common import EXIT_JOB_FAILED, Context, handled

if TYPE_CHECKING:
    from ..demo import replay

REPLICA = (sys.executable, "-m", "oncely.cli.demo_replica")
"""How a replica process of the demo starts (see cli/demo_replica.py)."""

WHY = """\
Why: the try-lock only keeps simultaneous ticks apart; each replica's commit released it for
the next one. The thread-title sentinel depended on a side effect that failed silently. oncely
inserts the slot's claim (job, key) in the same transaction as the work, so the next replica
finds it and skips; a rollback would have freed the slot for a clean retry."""


def _members(values: dict[str, int], fmt: str) -> str:
    from ..demo import leaderboard as lb

    return " ".join(fmt.format(values.get(m, 0)) for m in lb.TOP3)


def table(report: replay.Report) -> str:
    """The before/after table: every number counted in the database."""
    from ..demo import leaderboard as lb
    from ..demo import replay

    rows = []
    for scenario in replay.SCENARIOS:
        t = report.tallies[scenario.name]
        closed = len(t.closed_by)
        rows.append(
            [
                scenario.title.split(")")[0] + ") " + _SHORT[scenario.name],
                _members(t.notifications, "{}"),
                _members(t.coins, "+{}"),
                str(t.threads),
                "once" if closed == 1 else f"{closed} times",
            ]
        )
    headers = [
        "",
        f"NOTIFICATIONS ({'/'.join(lb.TOP3)})",
        "COINS",
        "SUMMARY THREADS",
        "WEEK CLOSED",
    ]
    return render.table(headers, rows)


COINS_QUERY = "SELECT scenario, member, sum(amount) FROM demo_coins GROUP BY 1, 2"


def kept(report: replay.Report) -> str:
    """How to look at what `--keep` left, and how to get rid of it."""
    if report.path is None:
        return (
            f"kept: the demo_* tables and the leaderboard_close claim in {report.database};\n"
            "  the next `oncely demo` on this database replaces them (without --keep, removes them)"
        )
    db = f"{report.path}/demo.db"
    return "\n".join(
        [
            f"kept: {db} (delete {report.path} when done); look inside with",
            f"  oncely --database-url sqlite:///{db} history leaderboard_close",
            f"  sqlite3 {db} '{COINS_QUERY}'",
        ]
    )


_SHORT = {
    "naive": "try-lock only",
    "sentinel": "try-lock + title sentinel",
    "oncely": "oncely",
}


@click.command()
@click.option(
    "--database-url",
    "demo_url",
    metavar="URL",
    help="Run on this database (e.g. Postgres) instead of a temporary SQLite file; the demo "
    "writes demo_* tables there and removes them afterwards unless --keep.",
)
@click.option("--keep", is_flag=True, help="Keep the database and its rows to inspect them.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document.")
@click.pass_context
@handled
def demo(ctx: click.Context, demo_url: str | None, keep: bool, as_json: bool) -> None:
    """Replay the Friday 18:00 incident: 3 replica processes, one slot, three ways."""
    import asyncio

    from ..demo import replay

    obj: Context = ctx.obj
    url = demo_url
    parent = ctx.parent
    if url is None and parent is not None:
        # `oncely --database-url URL demo` counts; $ONCELY_DATABASE_URL does not, so the
        # demo never writes to a database just because the environment points at one.
        source = parent.get_parameter_source("database_url")
        if source is click.core.ParameterSource.COMMANDLINE:
            url = obj.database_url

    def show(line: str) -> None:
        if not as_json:
            click.echo(line)

    with replay.database(url, keep) as (db_url, directory):
        report = asyncio.run(replay.run_demo(db_url, directory, keep, show, REPLICA))
    if as_json:
        click.echo(render.dumps(report.as_dict()))
    else:
        click.echo("")
        click.echo("Before / after (counted in the database after the runs):")
        click.echo(table(report))
        click.echo("")
        click.echo(WHY)
        if keep:
            click.echo("")
            click.echo(kept(report))
    if not report.ok:
        click.echo("error: oncely's scenario did not close the week exactly once", err=True)
        sys.exit(EXIT_JOB_FAILED)
