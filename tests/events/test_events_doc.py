"""docs/events.md lists every event oncely emits."""

from __future__ import annotations

import re

from tests.support import ROOT


def test_every_emitted_event_is_documented() -> None:
    emitted = set()
    for path in (ROOT / "src" / "oncely").rglob("*.py"):
        if path.name == "metrics.py":  # it names events it listens to, it emits none
            continue
        emitted |= set(re.findall(r'emit\(\s*"([a-z_]+\.[a-z_]+)"', path.read_text()))
        emitted |= set(re.findall(r'"event": "([a-z_]+\.[a-z_]+)"', path.read_text()))
        # Events built as (name, text, level, fields) tuples and emitted later (not the
        # dashboard's template names, such as "task.html").
        tuples = re.findall(r'^\s*\(?"(task\.[a-z_]+)",', path.read_text(), re.M)
        emitted |= {name for name in tuples if name != "task.html"}
    documented = set(
        re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \|", (ROOT / "docs" / "events.md").read_text(), re.M)
    )
    assert emitted >= {"run.ran", "run.missed", "worker.shutdown"}
    assert emitted - documented == set()
    assert documented - emitted == set()
