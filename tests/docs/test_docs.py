"""The docs are tested: their examples run, their links resolve, the README starts right.

A fenced block runs when the line before it is `<!-- oncely:runnable -->`; with
`<!-- oncely:runnable file=NAME -->` a block is written to NAME instead (for the shell blocks
after it); `<!-- file: NAME -->` blocks belong to docs/testing.md's guide, which
tests/testing/test_guide.py writes out and runs. Each document's blocks run in order, in one
fresh directory, with `ONCELY_DATABASE_URL` pointing at a SQLite file there. Every ```python
block must be marked runnable or `<!-- oncely:not-runnable: why -->`, so an example cannot
silently go stale.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import ROOT

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
