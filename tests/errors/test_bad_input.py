"""Bad input is exit 2 with one clear line: never a traceback, never exit 1 (which means "the
job raised"), and the database is left as it was. The listed inputs each once; then a
hypothesis fuzz over the CLI's arguments."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support import snapshot

from oncely import ConfigError, Oncely
from oncely.cli import cli

APP = "tests.apps.reliab_app"
DEEP = "[" * 60_000 + "]" * 60_000


@pytest.fixture
def fresh_app() -> Iterator[None]:
    sys.modules.pop(APP, None)
    yield
    sys.modules.pop(APP, None)


def invoke(db_url: str, *args: str) -> Result:
    sys.modules.pop(APP, None)  # a new process would import the app anew
    return CliRunner().invoke(cli, ["--app", f"{APP}:app", "--database-url", db_url, *args])


def clear_refusal(result: Result) -> str:
    """Exit 2 and one clear error: oncely's `error: …` line, or click's usage error."""
    output = result.stdout + result.stderr
    assert result.exit_code == 2, (result.exit_code, output, result.exception)
    assert "Traceback" not in output, output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error: ", "Error: "))]
    assert len(errors) == 1, result.stderr
    if errors[0].startswith("error: "):
        assert len(lines) == 1, result.stderr
    return errors[0]


BAD = {
    "now-year-1": ["run", "minutely", "--now", "0001-01-01T00:00:00Z"],
    "next-near-9999": ["next", "minutely", "--after", "9999-12-31T23:59:00Z"],
    "next-9999-many": ["next", "nightly", "--after", "9998-12-30T00:00:00Z", "-n", "10000"],
    "json-deep": ["enqueue", "note", "--json", '{"n": ' + DEEP + "}"],
    "json-5000-digits": ["enqueue", "note", "--json", '{"n": 1' + "0" * 5000 + "}"],
    "json-nan": ["enqueue", "note", "--json", '{"n": NaN}'],
    "json-inf": ["enqueue", "note", "--json", '{"n": -Infinity}'],
    "huge-delay": ["enqueue", "note", "--delay", "99999999999999999w"],
    "huge-older-than": ["prune", "--older-than", "99999999999999999w"],
    "release-not-utf8": ["release", "minutely", "key-\udcff"],
    "enqueue-key-not-utf8": ["enqueue", "note", "--idempotency-key", "k-\udcff"],
    "enqueue-json-not-utf8": ["enqueue", "note", "--json", '{"n": "\udcff"}'],
    "retry-2**70": ["tasks", "retry", str(2**70)],
    "discard-2**70": ["tasks", "discard", str(2**70)],
    "lease-nan": ["worker", "--lease", "nan"],
    "lease-inf": ["worker", "--lease", "inf"],
    "shutdown-timeout-nan": ["worker", "--shutdown-timeout", "nan"],
    "startup-wait-inf": ["worker", "--startup-wait", "inf"],
    "history-unknown-job": ["history", "no_such_job"],
    "key-func-lone-surrogate": ["run", "surrogate_key", "--now", "2026-12-01T10:00:00Z"],
    "pause-unknown-job": ["pause", "no_such_job"],
    "resume-unknown-job": ["resume", "no_such_job"],
    "pause-reason-not-utf8": ["pause", "minutely", "--reason", "r-\udcff"],
    "backfill-unknown-job": [
        "backfill",
        "no_such_job",
        "--from",
        "2026-12-01T00:00:00Z",
        "--to",
        "2026-12-01T01:00:00Z",
    ],
    "backfill-reversed": [
        "backfill",
        "minutely",
        "--from",
        "2026-12-01T01:00:00Z",
        "--to",
        "2026-12-01T00:00:00Z",
        "--apply",
    ],
    "backfill-empty-range": [
        "backfill",
        "minutely",
        "--from",
        "2026-12-01T01:00:00Z",
        "--to",
        "2026-12-01T01:00:00Z",
        "--apply",
    ],
    "backfill-unparsable-from": [
        "backfill",
        "minutely",
        "--from",
        "yesterday",
        "--to",
        "2026-12-01T00:00:00Z",
        "--apply",
    ],
    "backfill-naive-to": [
        "backfill",
        "minutely",
        "--from",
        "2026-12-01T00:00:00Z",
        "--to",
        "2026-12-01T01:00:00",
        "--apply",
    ],
    "backfill-over-max-slots": [
        "backfill",
        "minutely",
        "--from",
        "2026-12-01T00:00:00Z",
        "--to",
        "2026-12-02T00:00:00Z",
        "--apply",
    ],
    "backfill-over-given-max": [
        "backfill",
        "minutely",
        "--from",
        "2026-12-01T00:00:00Z",
        "--to",
        "2026-12-01T00:10:00Z",
        "--max-slots",
        "5",
        "--apply",
    ],
    "explain-unknown-job": ["explain", "no_such_job"],
    "explain-unparsable-slot": ["explain", "minutely", "--slot", "noon"],
    "cancel-nothing-running": ["cancel", "minutely"],
    "cancel-unknown-job": ["cancel", "no_such_job"],
    "cancel-unparsable-slot": ["cancel", "minutely", "--slot", "2026-13-01T00:00:00Z"],
    "tasks-cancel-no-such-task": ["tasks", "cancel", "999"],
    "tasks-explain-no-such-task": ["tasks", "explain", "999"],
    "audit-limit-0": ["audit", "--limit", "0"],
    "release-no-claim": ["release", "minutely", "2026-12-01T10:00:00Z"],
}


@pytest.mark.parametrize("case", list(BAD))
def test_each_listed_bad_input_is_exit_2(db_url: str, fresh_app: None, case: str) -> None:
    assert invoke(db_url, "migrate").exit_code == 0
    before = snapshot(db_url)
    clear_refusal(invoke(db_url, *BAD[case]))
    assert snapshot(db_url) == before


@pytest.mark.parametrize("lease", [float("nan"), float("inf"), 0, -1])
def test_a_non_finite_lease_is_refused_by_the_app(lease: float) -> None:
    with pytest.raises(ConfigError):
        Oncely("sqlite://", lease=lease)


# -- the fuzz ------------------------------------------------------------------------------

JOBS = st.sampled_from(["minutely", "nightly", "surrogate_key", "nope"]) | st.text(max_size=8)
WORDS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e400", str(2**70), "1e9", "x"]),
    st.sampled_from(["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "2026-12-01T10:00Z"]),
    st.sampled_from(["1h", "30d", "0s", "9" * 30 + "w", "1.5x", "5m"]),
    st.sampled_from(["{}", '{"n": 1}', "[]", '{"n": NaN}', "{", "[" * 3000, '"\udcff"']),
)
COMMAND = st.sampled_from(
    [
        ["run"],
        ["next"],
        ["history"],
        ["release"],
        ["enqueue"],
        ["tasks"],
        ["tasks", "retry"],
        ["tasks", "discard"],
        ["prune"],
        ["list"],
        ["pause"],
        ["resume"],
        ["backfill"],
        ["explain"],
        ["cancel"],
        ["audit"],
        ["tasks", "cancel"],
        ["tasks", "explain"],
    ]
)
OPTIONS = st.sampled_from(
    [
        "--now",
        "--after",
        "-n",
        "--limit",
        "--json",
        "--idempotency-key",
        "--delay",
        "--older-than",
        "--state",
        "--task",
        "--allow-future",
        "--from",
        "--to",
        "--slot",
        "--max-slots",
        "--reason",
        "--actor",
    ]
)
ARGS = st.lists(st.one_of(JOBS, WORDS, OPTIONS), max_size=6)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(command=COMMAND, args=ARGS)
def test_fuzzed_arguments_never_crash(tmp_path: Path, command: list[str], args: list[str]) -> None:
    db_url = f"sqlite:///{tmp_path / 'fuzz.db'}"
    if not (tmp_path / "fuzz.db").exists():
        assert invoke(db_url, "migrate").exit_code == 0
    if "hold" in args:  # the one job that waits for a signal file
        return
    before = snapshot(db_url)
    result = invoke(db_url, *command, *args)
    output = result.stdout + result.stderr
    assert result.exit_code in (0, 2), (command, args, result.exit_code, output, result.exception)
    assert "Traceback" not in output, output
    if result.exit_code == 2:
        clear_refusal(result)
        # A refusal changes nothing, but for the audit row of an action refused on a target
        # that exists (pausing a paused job, resuming one that is not).
        assert without_refusals(snapshot(db_url)) == without_refusals(before), (command, args)


def without_refusals(tables: dict[str, list[Any]]) -> dict[str, list[Any]]:
    audit = [row for row in tables.get("oncely_audit", []) if "refused: " not in row[-1]]
    return {**tables, "oncely_audit": audit}
