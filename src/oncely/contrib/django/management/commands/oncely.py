"""`manage.py oncely …`: every `oncely` command, with the same options and exit codes.

The arguments go to oncely's own command line unchanged, with `--app` set to
`ONCELY["APP"]` (an app with no jobs if unset) unless given: `manage.py oncely run JOB
--now ISO`, `manage.py oncely worker`, `manage.py oncely history` … on the database of
`ONCELY["DATABASE"]` (`--database-url` overrides it; `$ONCELY_DATABASE_URL` does not).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from typing import Any

import click
from django.core.management.base import BaseCommand

from .....cli import cli
from ...settings_app import app_spec


def oncely_args(args: list[str]) -> list[str]:
    """`args` for oncely's command line, with the configured app unless `--app` is given.

    The database is Django's (`ONCELY["DATABASE"]`): `$ONCELY_DATABASE_URL` is not read
    here; an explicit `--database-url` still overrides it.
    """
    os.environ.pop("ONCELY_DATABASE_URL", None)
    if any(a == "--app" or a.startswith("--app=") for a in args):
        return args
    return ["--app", app_spec(), *args]


_HELP = {
    "app_spec": 'Where your Oncely app lives (MODULE:ATTR; default: settings.ONCELY["APP"]).',
    "database_url": (
        'Database to use instead of settings.ONCELY["DATABASE"]\'s (a URL; '
        "Django's settings, not the environment, say which database)."
    ),
}


def django_cli() -> click.Group:
    """oncely's command line as `manage.py oncely` runs it: the app and the database come
    from Django's settings, so `--app` and `--database-url` read no environment variable
    and their help names none."""
    group = copy.copy(cli)
    group.params = [_from_settings(param) for param in cli.params]
    return group


def _from_settings(param: click.Parameter) -> click.Parameter:
    if param.name not in _HELP or not isinstance(param, click.Option):
        return param
    option = copy.copy(param)
    option.envvar = None
    option.help = _HELP[param.name]
    return option


class Command(BaseCommand):
    help = "oncely's command line on this project's app and database (see `oncely --help`)."

    def run_from_argv(self, argv: list[str]) -> None:
        # Not Django's argument parser: oncely's own, so options and exit codes are its own.
        prog = f"{argv[0].rsplit('/', 1)[-1]} {argv[1]}"
        django_cli().main(args=oncely_args(argv[2:]), prog_name=prog, standalone_mode=True)

    def add_arguments(self, parser: Any) -> None:
        # For call_command: everything after the command's name is oncely's.
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        """`call_command("oncely", "history")`: the same command line; its exit code is
        raised as SystemExit when it is not 0."""
        try:
            django_cli().main(
                args=oncely_args(list(args)), prog_name="oncely", standalone_mode=True
            )
        except SystemExit as exit_:
            if exit_.code not in (0, None):
                raise
        sys.stdout.flush()
