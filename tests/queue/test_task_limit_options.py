"""`@app.task`'s limit options fail at registration, naming the task; results are checked by
one pure function (JSON, size limit)."""

from __future__ import annotations

from typing import Any

import pytest

from oncely import ConfigError, Oncely, ResultError
from oncely.tasks import encode_result, parse_rate


async def work(db, n: int = 0) -> None:  # type: ignore[no-untyped-def]
    pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency must be an int >= 1, got 0"),
        ({"concurrency": -3}, "concurrency must be an int >= 1"),
        ({"concurrency": 1.5}, "concurrency must be an int >= 1"),
        ({"concurrency": True}, "concurrency must be an int >= 1"),
        ({"concurrency_key": lambda n: n}, "concurrency_key= needs concurrency="),
        ({"concurrency": 1, "concurrency_key": "n"}, "must be a function of the task's"),
        ({"rate": "fast"}, "rate 'fast' is not a rate"),
        ({"rate": "100"}, "rate '100' is not a rate"),
        ({"rate": "0/s"}, "must allow at least 1 start"),
        ({"rate": "10/week"}, "is not a rate"),
        ({"rate": 100}, "is not a rate"),
        ({"rate_key": lambda n: n}, "rate_key= needs rate="),
        ({"priority": "high"}, "priority must be an int"),
        ({"priority": 2**40}, "priority must be an int"),
        ({"max_result": 0}, "max_result must be a number of bytes >= 1"),
    ],
)
def test_bad_limit_options_fail_at_registration_naming_the_task(
    options: dict[str, Any], message: str
) -> None:
    app = Oncely("sqlite:///unused.db")
    with pytest.raises(ConfigError, match=r"^task 'sync_customer': ") as raised:
        app.task(name="sync_customer", **options)(work)
    assert message in str(raised.value)
    assert len(app.tasks) == 0


@pytest.mark.parametrize(
    ("rate", "parsed"),
    [
        ("100/s", (100, 1.0)),
        ("1000/min", (1000, 60.0)),
        ("5 / 10s", (5, 10.0)),
        ("20/h", (20, 3600.0)),
        ("1/day", (1, 86400.0)),
        ("3/0.5s", (3, 0.5)),
        ("7/seconds", (7, 1.0)),
    ],
)
def test_rates_parse_to_starts_per_period(rate: str, parsed: tuple[int, float]) -> None:
    assert parse_rate(rate, "task 't'") == parsed


def test_a_registered_task_carries_its_limits() -> None:
    app = Oncely("sqlite:///unused.db")
    key = lambda n: f"c{n}"  # noqa: E731
    task = app.task(concurrency=2, concurrency_key=key, rate="10/min", priority=-5)(work)
    assert (task.limits.concurrency, task.limits.rate, task.limits.priority) == (2, (10, 60.0), -5)
    entry = task.entry({"n": 7})
    assert entry["concurrency_key"] == "c7" and entry["rate_key"] == ""
    assert (entry["priority"], entry["concurrency"], entry["rate_period"]) == (-5, 2, 60.0)
    assert task.entry({"n": 7}, priority=9)["priority"] == 9


def test_results_are_json_within_the_limit() -> None:
    assert encode_result(None, "t") is None
    assert encode_result({"a": [1, 2.5, "é"]}, "t") == '{"a":[1,2.5,"é"]}'
    assert encode_result("x" * 98, "t", limit=100) == '"' + "x" * 98 + '"'
    with pytest.raises(ResultError, match=r"task 't': its return value is 103 bytes of JSON"):
        encode_result("x" * 101, "t", limit=100)
    with pytest.raises(ResultError, match=r"task 't': its return value is a set"):
        encode_result({1, 2}, "t")
    with pytest.raises(ResultError, match="JSON cannot represent"):
        encode_result(float("nan"), "t")
