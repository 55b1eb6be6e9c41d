"""CONTRIBUTING's walks ("Follow a task's payload", "Follow a slot's attempt") name files,
classes and functions for a newcomer to open in order: every one of them must exist, so that
a rename cannot leave a walk pointing at nothing."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import ROOT

SRC = ROOT / "src" / "oncely"
NAME = re.compile(r"^[\w./]+$")


@dataclass
class Source:
    """What the package defines, read from its source (nothing imported)."""

    members: dict[str, set[str]] = field(default_factory=dict)
    """A class's methods and attributes (its own, class-level and `self.x = ...`)."""
    bases: dict[str, list[str]] = field(default_factory=dict)
    modules: dict[str, list[set[str]]] = field(default_factory=dict)
    """A module's file name (without .py) to the top-level names of each file so named."""
    words: set[str] = field(default_factory=set)
    """Every identifier and string's word in the source."""

    def has(self, cls: str, name: str) -> bool:
        seen: set[str] = set()
        todo = [cls]
        while todo:
            c = todo.pop()
            if c in seen:
                continue
            seen.add(c)
            if name in self.members.get(c, set()):
                return True
            todo += self.bases.get(c, [])
        return False


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _self_attributes(method: ast.AST) -> set[str]:
    """The attributes a method sets on `self`."""
    return {
        sub.attr
        for sub in ast.walk(method)
        if isinstance(sub, ast.Attribute)
        and isinstance(sub.ctx, ast.Store)
        and isinstance(sub.value, ast.Name)
        and sub.value.id == "self"
    }


def read_source(root: Path) -> Source:
    src = Source()
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        src.words |= set(re.findall(r"\w+", text))
        tree = ast.parse(text)
        top: set[str] = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                top.add(node.name)
            top.update(_targets(node))
            if isinstance(node, ast.ImportFrom):
                top.update(a.asname or a.name for a in node.names)
        src.modules.setdefault(path.stem, []).append(top)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            members = src.members.setdefault(node.name, set())
            src.bases.setdefault(node.name, []).extend(
                b.id for b in node.bases if isinstance(b, ast.Name)
            )
            for item in node.body:
                members.update(_targets(item))
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                    members.update(_self_attributes(item))
    return src


def walks(text: str) -> dict[str, str]:
    """CONTRIBUTING's sections whose title starts with "Follow", by title."""
    found: dict[str, str] = {}
    for part in re.split(r"^(?=#+ )", text, flags=re.M):
        title, _, body = part.partition("\n")
        if title.startswith("### Follow"):
            found[title.removeprefix("### ")] = body
    return found


def missing(body: str, src: Source, root: Path = ROOT) -> list[str]:
    """The names in `body` (in backticks) that the source does not have."""
    gone = []
    for name in re.findall(r"`([^`]+)`", body):
        if not NAME.match(name):
            continue  # a statement, a call with arguments: prose in backticks
        if "/" in name or name.endswith(".py"):
            places = (
                root / name,
                root / "src" / "oncely" / name,
                root / "src" / "oncely" / "store" / name,
            )
            if not any(place.exists() for place in places):
                gone.append(name)
            continue
        head, _, rest = name.partition(".")
        if not rest:
            if head not in src.words:
                gone.append(name)
        elif head[0].isupper():
            if head not in src.members or not src.has(head, rest):
                gone.append(name)
        elif not any(rest in top for top in src.modules.get(head, [])):
            gone.append(name)
    return gone


def test_contributing_has_both_walks() -> None:
    assert set(walks((ROOT / "CONTRIBUTING.md").read_text())) == {
        "Follow a task's payload",
        "Follow a slot's attempt",
    }


def test_every_name_a_walk_gives_exists() -> None:
    src = read_source(SRC)
    found = walks((ROOT / "CONTRIBUTING.md").read_text())
    assert {title: missing(body, src) for title, body in found.items()} == {
        title: [] for title in found
    }


def test_a_walk_naming_what_is_gone_fails() -> None:
    src = read_source(SRC)
    body = (
        "`store/task_queue.py` · `TaskQueue.lease` → `store/gone.py` · `TaskQueue.lease_all`,"
        " `registry.py`, `held.py`, `gone.py`"
        " → `runner.run_slot`, `runner.run_slots`, `Dialect.bulk_enqueue` (inherited),"
        " `Listener.woken` (set in `__init__`), `no_such_thing_anywhere`"
    )
    assert missing(body, src) == [
        "store/gone.py",
        "TaskQueue.lease_all",
        "gone.py",
        "runner.run_slots",
        "no_such_thing_anywhere",
    ]
