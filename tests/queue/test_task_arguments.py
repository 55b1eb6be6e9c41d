"""A worker checks that a task's arguments bind its function before it counts an attempt:
`Task.unbound` says what a worker that can run them must accept, or None."""

from __future__ import annotations

from typing import Any

import pytest

from oncely import Oncely


@pytest.mark.parametrize(
    ("args", "wants"),
    [
        ({"n": 1}, None),
        ({"n": 1, "currency": "eur"}, "accepts `currency`"),
        ({"n": 1, "currency": "eur", "vat": 2}, "accepts `currency`, `vat`"),
        ({}, "does not require `n`"),
    ],
)
def test_unbound_names_what_a_worker_that_can_run_the_arguments_accepts(
    args: dict[str, Any], wants: str | None
) -> None:
    app = Oncely("sqlite+aiosqlite:///:memory:")

    @app.task
    async def eff(db, n: int) -> None:  # type: ignore[no-untyped-def]
        pass

    unbound = eff.unbound(args)
    assert (unbound[0] if unbound else None) == wants
    if unbound is not None:
        assert "argument" in unbound[1]  # Python's own message, for the record


def test_a_function_with_kwargs_takes_any_extra_argument() -> None:
    app = Oncely("sqlite+aiosqlite:///:memory:")

    @app.task
    async def eff(db, n: int, **more: Any) -> None:  # type: ignore[no-untyped-def]
        pass

    assert eff.unbound({"n": 1, "currency": "eur"}) is None
    assert eff.unbound({"currency": "eur"}) == (
        "does not require `n`",
        "missing a required argument: 'n'",
    )
