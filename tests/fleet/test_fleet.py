"""The fleet checker's short seeded form: 3 real workers on Postgres for 40 seconds of seeded
operator actions and faults, then every slot and task checked against the fate model
(guarantee 11). The long form: `python scripts/fleet.py --duration 600`."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.fleet.harness import Options, plan
from tests.fleet.runner import run

SEED = 7
DURATION = 40.0


def test_the_plan_is_a_function_of_the_seed(tmp_path: Path) -> None:
    options = Options(url="postgresql://x/y", run_dir=tmp_path, seed=SEED, duration=DURATION)
    first = plan(options)
    assert first == plan(options)
    assert first != plan(Options(url="postgresql://x/y", run_dir=tmp_path, seed=SEED + 1))
    kinds = {s.kind for s in first}
    assert {"kill", "stop", "cut"} & kinds, kinds  # this seed's short form has faults
    assert len(first) == int(DURATION / options.step) - (DURATION % options.step == 0)


@pytest.mark.postgres
@pytest.mark.timeout(180)  # 40 s of actions, the drain and the checks: a soak in small
async def test_every_slot_and_task_of_a_fleet_is_accounted_for(
    postgres_database: str, tmp_path: Path
) -> None:
    from tests.conftest import _reset_postgres

    _reset_postgres(postgres_database)
    options = Options(url=postgres_database, run_dir=tmp_path, seed=SEED, duration=DURATION)
    report = await run(options)
    print("\n".join(report.lines()))
    print(report.summary())
    assert report.slots > 100 and report.tasks >= 10 and report.faults >= 1
    assert report.ok, "\n".join([*report.lines(), report.summary()])
