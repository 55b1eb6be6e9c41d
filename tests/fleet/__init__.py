"""The fleet checker: real `oncely worker` processes, a seeded schedule of operator actions
and faults, and a check of every slot and task against the fate model (docs/design/fate.md).
`scripts/fleet.py` runs its long form; tests/fleet/test_fleet.py its short seeded form."""
