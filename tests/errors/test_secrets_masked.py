"""No credential a database URL can carry is ever printed: not in errors, not in text or JSON
log lines, not in tracebacks, not in `--help`. Every command that opens the database, in
both log formats, against every shape of URL (the database is unreachable, so each command
reports an error naming it)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from oncely.cli import cli
from oncely.masking import mask_secrets, mask_url

APP = "tests.apps.reliab_app"
FRAGMENTS = ("hunter2", "hun@", "ter2", "tok3n")
SHAPES = {
    "userinfo": "postgresql://alice:hunter2@127.0.0.1:1/db",
    "query-password": "postgresql://alice@127.0.0.1:1/db?password=hunter2",
    "unencoded-at": "postgresql://alice:hun@ter2@127.0.0.1:1/db",
    "secret-params": "postgresql://alice@127.0.0.1:1/db?sslpassword=hunter2&token=tok3n&x=1",
    "malformed": "postgresql://alice:hun@ter2@127.0.0.1:notaport/db?password=hunter2",
}
COMMANDS = {
    "migrate": [],
    "run": ["minutely", "--now", "2026-12-01T10:00:00Z"],
    "list": [],
    "history": [],
    "release": ["minutely", "2026-12-01T10:00:00Z"],
    "worker": ["--startup-wait", "0", "--concurrency", "0"],
    "enqueue": ["note"],
    "tasks": [],
    "prune": ["--older-than", "1d"],
    "pause": ["minutely", "--reason", "r"],
    "resume": ["minutely"],
    "backfill": ["minutely", "--from", "2026-12-01T10:00:00Z", "--to", "2026-12-01T10:05:00Z"],
    "explain": ["minutely", "--json"],
    "cancel": ["minutely"],
    "audit": ["--json"],
}


@pytest.fixture
def fresh_app() -> Iterator[None]:
    """Import the app anew for each invocation, as a new `oncely` process would."""
    sys.modules.pop(APP, None)
    yield
    sys.modules.pop(APP, None)


def leaked(text: str) -> list[str]:
    return [f for f in FRAGMENTS if f in text]


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_command_prints_a_credential(
    fresh_app: None, command: str, shape: str, fmt: str
) -> None:
    args = ["--app", f"{APP}:app", "--database-url", SHAPES[shape], "--log-format", fmt]
    result = CliRunner().invoke(cli, [*args, command, *COMMANDS[command]], env={"CI": "true"})
    output = result.stdout + result.stderr
    assert result.exit_code == 2, (result.exit_code, output, result.exception)
    assert "error:" in result.stderr, output
    assert "Traceback" not in output, output
    assert not leaked(output), output


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_shows_no_credential(fresh_app: None, command: str | None) -> None:
    env = {"ONCELY_DATABASE_URL": SHAPES["query-password"], "ONCELY_APP": f"{APP}:app"}
    result = CliRunner().invoke(cli, [*([command] if command else []), "--help"], env=env)
    assert result.exit_code == 0, result.output
    assert not leaked(result.output), result.output


@pytest.mark.parametrize("url", list(SHAPES.values()))
def test_mask_url_hides_every_shape(url: str) -> None:
    masked = mask_url(url)
    assert not leaked(masked), masked
    assert masked.startswith("postgresql://") and "***" in masked
    assert not leaked(mask_secrets(f"error at {url!r}: boom")), mask_secrets(url)


def test_mask_url_keeps_what_is_not_secret() -> None:
    assert mask_url("postgresql://alice@db.internal:5432/app?application_name=web") == (
        "postgresql://alice@db.internal:5432/app?application_name=web"
    )
    assert mask_url("sqlite:////var/lib/app.db") == "sqlite:////var/lib/app.db"
