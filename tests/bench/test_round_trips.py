"""What one `app.run` sends to Postgres: a count, not a time, so it can guard the cost.

A steady-state attempt is four messages on the wire, each one round trip: BEGIN, the
lock-and-claim CTE (which also reads whether a pause of the job holds the slot's time:
`app.run`, `oncely run` and the worker's attempts honour `oncely pause`), the check of the
slot's fate with the SAVEPOINT a failed attempt rolls back to (a statement of its own, after
the lock's: its snapshot must see the fate that the lock's previous holder committed), and
the finish UPDATE sent with the COMMIT. A quick attempt that succeeds writes no attempt record
(its claim is its record). A per-checkout ping (pool_pre_ping) once made it eight, the finish
UPDATE on its own five, and the pause read as a statement of its own five; a statement added
to the attempt shows up here before it shows up in a benchmark.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from oncely import Oncely, RunStatus, every

SLOT = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.postgres
async def test_app_run_is_four_round_trips(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import _reset_postgres, wire_messages

    _reset_postgres(postgres_database)
    app = Oncely(postgres_database)

    @app.job(every(seconds=1), name="noop")
    async def noop(db, now) -> None:  # type: ignore[no-untyped-def]
        return None

    try:
        await app.migrate()
        await app.run("noop", now=SLOT)  # prepares the statements once
        with wire_messages(monkeypatch) as sent:
            for second in range(1, 4):
                sent.clear()
                result = await app.run("noop", now=SLOT + timedelta(seconds=second))
                assert result.status is RunStatus.RAN
                # Q = simple query (BEGIN; the fate check with the SAVEPOINT; the finish
                # with COMMIT), B = bind+execute of a prepared statement (lock-and-claim
                # with the pause read)
                assert sent == [b"Q", b"B", b"Q", b"Q"]
    finally:
        await app.aclose()
