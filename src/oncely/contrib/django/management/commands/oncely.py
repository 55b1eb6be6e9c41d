"""`manage.py oncely …`: every `oncely` command, with the same options and exit codes.

The arguments go to oncely's own command line unchanged, with `--app` set to
`ONCELY["APP"]` (an app with no jobs if unset) unless given: `manage.py oncely run JOB
--now ISO`, `manage.py oncely worker`, `manage.py oncely history` … on the database of
`ONCELY["DATABASE"]` (`--database-url` overrides it; `$ONCELY_DATABASE_URL` does not).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

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


class Command(BaseCommand):
    help = "oncely's command line on this project's app and database (see `oncely --help`)."

    def run_from_argv(self, argv: list[str]) -> None:
        # Not Django's argument parser: oncely's own, so options and exit codes are its own.
        prog = f"{argv[0].rsplit('/', 1)[-1]} {argv[1]}"
        cli.main(args=oncely_args(argv[2:]), prog_name=prog, standalone_mode=True)

    def add_arguments(self, parser: Any) -> None:
        # For call_command: everything after the command's name is oncely's.
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: str, **options: Any) -> None:
        """`call_command("oncely", "history")`: the same command line; its exit code is
        raised as SystemExit when it is not 0."""
        try:
            cli.main(args=oncely_args(list(args)), prog_name="oncely", standalone_mode=True)
        except SystemExit as exit_:
            if exit_.code not in (0, None):
                raise
        sys.stdout.flush()
