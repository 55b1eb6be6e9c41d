"""Observers of oncely's events: each called for the events it asked for, and an event that
nobody observes and the logger drops costs no more than a level check."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from oncely import events


def test_an_observer_with_names_sees_only_those_events() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def observer(event: str, fields: Mapping[str, Any]) -> None:
        seen.append((event, dict(fields)))

    events.subscribe(observer, {"task.retry"})
    try:
        events.emit("task.started", "started", level=logging.DEBUG, task="t", id=1)
        events.emit("task.retry", "retry", task="t", id=1, error=None)
    finally:
        events.unsubscribe(observer)
    events.emit("task.retry", "retry", task="t", id=2)
    assert seen == [("task.retry", {"task": "t", "id": 1})]


def test_an_observer_without_names_sees_every_event() -> None:
    seen: list[str] = []

    def observer(event: str, fields: Mapping[str, Any]) -> None:
        seen.append(event)

    events.subscribe(observer)
    try:
        events.emit("task.started", "started", level=logging.DEBUG, task="t")
        events.emit("task.retry", "retry", task="t")
    finally:
        events.unsubscribe(observer)
    assert seen == ["task.started", "task.retry"]


class Loud:
    """A field value that records being turned into text (as a log line would)."""

    def __init__(self) -> None:
        self.formatted = 0

    def __str__(self) -> str:
        self.formatted += 1
        return "loud"


def test_an_event_nobody_observes_and_the_logger_drops_is_not_formatted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loud = Loud()
    with caplog.at_level(logging.INFO, logger="oncely"):
        events.emit("task.started", "started", level=logging.DEBUG, task=loud)
        assert loud.formatted == 0 and caplog.records == []
    with caplog.at_level(logging.DEBUG, logger="oncely"):
        events.emit("task.started", "started", level=logging.DEBUG, task=loud)
    assert loud.formatted == 1
    assert [r.getMessage() for r in caplog.records] == ["task.started: started task=loud"]
