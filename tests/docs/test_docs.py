"""The docs are tested: their examples run, their links resolve, the README starts right.

A fenced block runs when the line before it is `<!-- oncely:runnable -->`; with
`<!-- oncely:runnable file=NAME -->` a block is written to NAME instead (for the shell blocks
after it); `<!-- file: NAME -->` blocks belong to docs/testing.md's guide, which
tests/testing/test_guide.py writes out and runs. Each document's blocks run in order, in one
fresh directory, with `ONCELY_DATABASE_URL` pointing at a SQLite file there. Every ```python
block must be marked runnable or `<!-- oncely:not-runnable: why -->`, so an example cannot
silently go stale. Nor can a guide name a feature that is not there: every `oncely COMMAND`
the docs show must be a command of the CLI, and no sentence may say oncely lacks what
FEATURES proves it has (a web UI, rate limits, priorities …).
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support import ROOT

DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
MARK = re.compile(r"^<!-- oncely:(runnable|not-runnable)(?:(?: file=(\S+))|:[^>]*)? -->$")
# Blocks written out and run as files by tests/testing/test_guide.py (docs/testing.md).
GUIDE = re.compile(r"^<!-- file: [\w.]+ -->$")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass
class Block:
    doc: Path
    line: int
    lang: str
    mark: str | None
    file: str | None
    code: str


def blocks(doc: Path) -> list[Block]:
    found: list[Block] = []
    lines = doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        before = lines[i - 1].strip() if i else ""
        mark = MARK.match(before)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        found.append(
            Block(
                doc,
                i + 1,
                fence.group(1),
                mark.group(1) if mark else ("guide" if GUIDE.match(before) else None),
                mark.group(2) if mark else None,
                "\n".join(lines[i + 1 : end]) + "\n",
            )
        )
        i = end + 1
    return found


def runnable_docs() -> list[Path]:
    return [d for d in DOCS if any(b.mark == "runnable" for b in blocks(d))]


@pytest.mark.parametrize("doc", runnable_docs(), ids=lambda d: str(d.relative_to(ROOT)))
def test_doc_examples_run(doc: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "ONCELY_DATABASE_URL": f"sqlite:///{tmp_path / 'oncely.db'}",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("ONCELY_APP", None)
    env.pop("DATABASE_URL", None)  # the how-tos read it; here they run on SQLite
    for n, block in enumerate(b for b in blocks(doc) if b.mark == "runnable"):
        where = f"{doc.relative_to(ROOT)}:{block.line}"
        if block.file:
            (tmp_path / block.file).write_text(block.code)
            continue
        if block.lang == "python":
            script = tmp_path / f"example_{n}.py"
            script.write_text(block.code)
            command = [sys.executable, str(script)]
        elif block.lang in ("sh", "bash", "console"):
            command = ["bash", "-euo", "pipefail", "-c", block.code]
        else:
            raise AssertionError(f"{where}: cannot run a {block.lang!r} block")
        proc = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, f"{where} failed:\n{proc.stdout}\n{proc.stderr}"


def test_every_python_example_is_run_or_says_why_not() -> None:
    unmarked = [
        f"{b.doc.relative_to(ROOT)}:{b.line}"
        for d in DOCS
        for b in blocks(d)
        if b.lang == "python" and b.mark is None
    ]
    assert unmarked == []
    assert sum(b.mark == "runnable" for d in DOCS for b in blocks(d)) >= 8


def test_readme_starts_with_the_demo_and_the_test_command() -> None:
    text = (ROOT / "README.md").read_text()
    first = blocks(ROOT / "README.md")[0]
    before = text.split("```", 1)[0].strip().splitlines()
    assert len(before) <= 1 and (not before or before[0].startswith("# "))  # only the title
    commands = [line for line in first.code.splitlines() if line.strip()]
    assert commands == [
        "pip install -e . && oncely demo",
        "pip install -e '.[test]' && python -m pytest -n 2",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install --quiet -e '.[test]'" in ci  # the same install ...
    assert re.search(r"^python3? -m pytest -n 2$", ci, re.M)  # ... and the same test command


LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def test_relative_links_resolve() -> None:
    broken = []
    for doc in DOCS:
        for target, _anchor in LINK.findall(doc.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue
            path = (doc.parent / target).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_guarantees_page_links_each_guarantee_to_tests() -> None:
    text = (ROOT / "docs" / "guarantees.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert [s.split(".", 1)[0] for s in sections] == [str(n) for n in range(1, 12)]
    for section in sections:
        # Each proof reads [`file.py::test_name`](../tests/…/file.py).
        tests = re.findall(r"\[`([\w.]+)::(\w+)`\]\((\.\./tests/[^)]+)\)", section)
        pending = "TODO(lead)" in section
        assert tests or pending, section.splitlines()[0]
        for filename, name, path in tests:
            assert path.endswith("/" + filename), path
            source = (ROOT / "docs" / path).resolve().read_text()
            assert f"def {name}(" in source, f"{path}::{name}"


def test_metrics_page_lists_every_metric_and_event() -> None:
    from oncely import metrics

    text = (ROOT / "docs" / "metrics.md").read_text()
    for name in metrics.METRICS:
        assert f"`{name}`" in text, name
    for event in metrics.EVENTS:
        assert f"`{event}`" in text, event


def test_readme_says_what_the_full_suite_needs() -> None:
    """How long it takes, the Postgres user and database, every system package CI installs."""
    text = (ROOT / "README.md").read_text()
    assert re.search(r"\d+ to \d+ minutes", text)
    assert "as the\nuser `postgres`" in text or "user `postgres`" in text.replace("\n", " ")
    flat = " ".join(text.split())
    assert "`127.0.0.1:5432`" in flat and "database `postgres`" in flat
    assert "`oncely_test_<pid>`" in flat
    ci = (ROOT / ".ci" / "run").read_text()
    packages = re.findall(r"apt-get install -y -qq (\S+)", ci)
    assert packages, "CI installs no system packages?"
    for package in packages:
        assert f"`{package}`" in flat, package


# -- a guide that names a missing feature fails ------------------------------------------

SHELL_LANGS = ("sh", "bash", "console", "shell", "text", "")
INLINE = re.compile(r"`([^`\n]+)`")
SEGMENTS = re.compile(r"&&|\|\||[;|(]")
# What runs oncely's command line: itself, or Django's command under its name.
RUNNER = re.compile(
    r"^(?:\$\s+)?(?:\w+=\S+\s+)*(?:exec\s+|uv run\s+)?"
    r"(?:oncely|python3? -m oncely|(?:python3? )?(?:\S*/)?manage\.py oncely"
    r"|django-admin oncely|python3? -m django oncely)(?=\s|$)"
)


def _cli() -> tuple[Any, Any]:
    import click

    from oncely.cli import cli

    return cli, click.Context(cli)


def _shell_snippets(doc: Path) -> list[tuple[int, str]]:
    """The shell commands a document shows: its inline code spans and its shell blocks."""
    found: list[tuple[int, str]] = []
    fenced = blocks(doc)
    inside = {n for b in fenced for n in range(b.line, b.line + b.code.count("\n") + 2)}
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if number not in inside:
            found += [(number, span) for span in INLINE.findall(line)]
    for b in fenced:
        if b.lang in SHELL_LANGS:
            found += [(b.line + i + 1, line) for i, line in enumerate(b.code.splitlines())]
    return found


def _named_commands(text: str, takes_value: set[str]) -> list[list[str]]:
    """The `oncely` commands (and subcommands) that a shell line runs, skipping their global
    options."""
    found = []
    for segment in SEGMENTS.split(text):
        runner = RUNNER.match(segment.strip())
        if runner is not None:
            words = _command_words(segment.strip()[runner.end() :].split(), takes_value)
            found += [words] if words else []
    return found


def _command_words(tokens: list[str], takes_value: set[str]) -> list[str]:
    words: list[str] = []
    i = 0
    while i < len(tokens) and len(words) < 2:
        token = tokens[i]
        if token.startswith("-"):
            if words:
                break  # the command's own options: its subcommand comes first
            if token.split("=")[0] in takes_value and "=" not in token:
                i += 1  # the global option's value
        elif re.fullmatch(r"[a-z][a-z-]*", token):
            words.append(token)
        else:
            break
        i += 1
    return words


def _commands_named(docs: list[Path]) -> tuple[list[str], list[str]]:
    """Each `oncely` command the docs show ("doc:line: oncely cmd"), and those the CLI lacks."""
    cli, ctx = _cli()
    takes_value = {o for p in cli.params if not getattr(p, "is_flag", False) for o in p.opts}
    named, missing = [], []
    for doc in docs:
        for line, snippet in _shell_snippets(doc):
            for words in _named_commands(snippet, takes_value):
                name = doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc.name
                where = f"{name}:{line}: oncely {' '.join(words)}"
                named.append(where)
                if not _exists(cli.get_command(ctx, words[0]), words[1:]):
                    missing.append(where)
    return named, missing


def _exists(command: Any, rest: list[str]) -> bool:
    """Whether `command` exists, and so does its subcommand `rest[0]` if it is a group."""
    import click

    if command is None:
        return False
    if isinstance(command, click.Group) and rest:
        return command.get_command(click.Context(command), rest[0]) is not None
    return True


# Design notes may describe a command that is being built; the guides may not.
GUIDES = [d for d in DOCS if "design" not in d.relative_to(ROOT).parts]


def test_every_oncely_command_the_docs_name_exists() -> None:
    named, missing = _commands_named(GUIDES)
    assert len(named) > 50 and any(n.endswith("oncely run") for n in named), named
    assert not missing, "commands the docs name that the CLI does not have:\n" + "\n".join(missing)


def test_a_guide_naming_a_command_the_cli_lacks_fails(tmp_path: Path) -> None:
    guide = tmp_path / "guide.md"
    guide.write_text(
        "Run `oncely calendars add nightly` or `DATABASE_URL=x oncely --app a:b nosuch`.\n\n"
        "```sh\nmanage.py oncely tasks nosuch 4 && oncely tasks retry 4\n```\n"
        "`from oncely import Oncely`, `pip install oncely`, `oncely_runs`, `oncely.testing`.\n"
    )
    named, missing = _commands_named([guide])
    assert [m.split(": ", 1)[1] for m in missing] == [
        "oncely calendars add",
        "oncely nosuch",
        "oncely tasks nosuch",
    ], named
    assert len(named) == 4


def _has_web() -> bool:
    cli, ctx = _cli()
    return _has("oncely.web")() and cli.get_command(ctx, "web") is not None


def _task_option(name: str) -> Callable[[], bool]:
    def check() -> bool:
        from oncely import Oncely

        return name in inspect.signature(Oncely.task).parameters

    return check


def _has(module: str, path: str | None = None) -> Callable[[], bool]:
    """A check that `module` exists (and has the dotted attribute `path`)."""

    def check() -> bool:
        if importlib.util.find_spec(module) is None:
            return False
        obj: Any = importlib.import_module(module)
        for name in path.split(".") if path else []:
            obj = getattr(obj, name, None)
        return obj is not None

    return check


def _cron_takes_a_zone() -> bool:
    from oncely import cron

    return "tz" in inspect.signature(cron).parameters


# What oncely has, by the words a guide would use to say it is missing, and the public API
# that proves it is there. A guide that says oncely has no such thing is stale.
FEATURES: dict[str, Callable[[], bool]] = {
    r"web ui|web interface|dashboard": _has_web,
    r"rate limit": _task_option("rate"),
    r"priorit": _task_option("priority"),
    r"concurrency limit|per-key (?:concurrency|limit)": _task_option("concurrency"),
    r"task results?|return values?": _has("oncely.app", "Oncely.task_result"),
    r"time ?zones?": _cron_takes_a_zone,
    r"django admin|admin pages": _has("oncely.contrib.django.admin"),
    r"opentelemetry|tracing": _has("oncely.tracing"),
    r"prometheus|metrics": _has("oncely.metrics"),
    r"earlier (?:errors|ones)|attempt history|history of attempts|every attempt": _has(
        "oncely.app", "Oncely.task_errors"
    ),
    r"\bpause": _has("oncely.app", "Oncely.pause"),
    r"sqlite": _has("aiosqlite"),
}
# A negation followed closely by a feature's words: "no web UI", "not ... rate limits".
NEGATION = r"\b(?:no|not|without|lacks?|nor)\b[^.;]{0,60}?"
# Outside a section that lists what is missing, only a sentence whose subject is oncely.
ONCELY_LACKS = re.compile(
    r"\boncely\s+(?:\w+\s+){0,2}?(?:(?:has|have|keeps?|offers?|ships?|supports?) no"
    r"|(?:does|do) not (?:have|support|offer|keep|ship))\b",
    re.I,
)
LACKING_SECTION = re.compile(r"not do|not there|not yet|limitation|lacks", re.I)
SENTENCE = re.compile(r"(?<=[.;!?])\s+|\n\s*[-*] ")


def _claim_units(doc: Path) -> list[tuple[str, str, bool]]:
    """(section, sentence or table row, whether it lists what oncely has or lacks) for
    `doc`'s prose and tables (not its code)."""
    units = []
    heading = ""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.splitlines()
        if lines and lines[0].startswith("#"):
            heading, lines = lines[0], lines[1:]
        lacking = bool(LACKING_SECTION.search(heading))
        if lines and lines[0].startswith("|"):  # a table: oncely's own row lists what it has
            units += [(heading, row, row.startswith("| **oncely**")) for row in lines]
            continue
        for unit in SENTENCE.split("\n".join(lines)):
            if unit.strip():
                units.append((heading, " ".join(unit.split()), lacking))
    return units


def _stale_lack_claims(docs: list[Path]) -> list[str]:
    """Each sentence of `docs` that says oncely lacks a feature that FEATURES shows it has."""
    stale = []
    for doc in docs:
        for heading, sentence, lacking in _claim_units(doc):
            if not lacking and not ONCELY_LACKS.search(sentence):
                continue
            for words, present in FEATURES.items():
                if re.search(NEGATION + f"(?:{words})", sentence, re.I) and present():
                    stale.append(f"{doc.name} [{heading}] {words!r}: {sentence}")
    return stale


def test_no_guide_says_oncely_lacks_what_it_has() -> None:
    stale = _stale_lack_claims(DOCS)
    assert not stale, "the docs say oncely lacks what it has:\n" + "\n".join(stale)


def test_a_guide_saying_oncely_lacks_what_it_has_fails(tmp_path: Path) -> None:
    guide = tmp_path / "comparison.md"
    guide.write_text(
        "# Peers\n\n## What oncely does not do (yet)\n\n"
        "No web UI, no workflows or job dependencies, no rate limiting, no Redis/MySQL\n"
        "backends, no priorities beyond queues, a young codebase.\n\n"
        "## Tasks\n\n"
        "oncely keeps no earlier errors: only the last attempt's.\n"
        "A task without a rate limit runs as fast as the workers take it.\n\n"
        "| | Priorities |\n|---|---|\n| **procrastinate** | no priorities |\n"
    )
    stale = _stale_lack_claims([guide])
    flagged = [words for words in FEATURES if any(f"] {words!r}:" in line for line in stale)]
    assert flagged == [
        r"web ui|web interface|dashboard",
        r"rate limit",
        r"priorit",
        r"earlier (?:errors|ones)|attempt history|history of attempts|every attempt",
    ], stale
    assert len(stale) == 4, stale
