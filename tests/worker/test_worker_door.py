"""The task worker's one door to the store: every statement goes through the `WorkerConnections`
the store hands it (`store.worker_connections()`), so no module of the worker reaches the
store's engine or dialect (import-linter keeps it to the store's face; this reads the code)."""

from __future__ import annotations

import ast
from pathlib import Path

import oncely.work
import oncely.work.tasks

REACHES = {"engine", "dialect"}


def worker_modules() -> list[Path]:
    tasks = Path(oncely.work.tasks.__file__).parent
    return [*sorted(tasks.glob("*.py")), Path(oncely.work.__file__).parent / "sync_task.py"]


def reaches(path: Path) -> list[str]:
    """`line: name.attr` of every `.engine` / `.dialect` the module's code reads."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in REACHES
    ]


def test_the_worker_never_touches_the_store_s_engine_or_dialect() -> None:
    modules = worker_modules()
    assert len(modules) > 10  # the worker's parts, and the sync task's body
    found = {path.name: reaches(path) for path in modules}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_the_reading_finds_a_reach_where_there_is_one(tmp_path: Path) -> None:
    part = tmp_path / "part.py"
    part.write_text("def f(store):\n    return store.engine, store.dialect.notifies\n")
    assert reaches(part) == ["2: store.engine", "2: store.dialect"]
