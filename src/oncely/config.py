"""Every default of a worker, once: the API, the CLI and the docs read them from here."""

from __future__ import annotations

LEASE = 30.0
"""Seconds a worker holds a task before another may take it over; heartbeats renew it."""
CONCURRENCY = 10
"""Tasks a worker runs at once."""
POOL_SIZE = 10
"""Connections of a worker's pool: at most this many tasks are inside a transaction at once
(a task holds one from its first statement to its commit; one that makes none holds none)."""
GROUP = 1
"""Tasks a worker may run one after another in one transaction, a savepoint each, when it has
a backlog (Postgres, async tasks without a timeout): 1, no groups."""
GROUP_MAX = 50
"""The largest group: every task of a group holds a subtransaction, and Postgres keeps at
most 64 of a transaction's in shared memory before other backends' snapshots get slower."""
BATCH = 500
"""The most tasks a worker leases in one statement."""
PREFETCH = 50
"""Leased tasks a worker keeps ready beyond its concurrency, at most (and at most its
concurrency): a running task's successor does not wait for a lease."""
POLL = 1.0
"""Seconds between a worker's looks for due tasks when no notification wakes it."""
SHUTDOWN_TIMEOUT = 25.0
"""Seconds a stopping worker waits for running attempts before it cancels them (rolled back,
tasks handed back): inside Kubernetes' default 30 s grace period, with room to spare for the
hand-back and the exit before SIGKILL."""
STARTUP_WAIT = 60.0
"""Seconds a starting worker waits for the database to come up before it gives up."""
MAX_SLOTS = 1000
"""The most slots one backfill plans or runs, unless told otherwise."""

SCHEDULE_POLL = 1.0
"""Seconds between two looks of a worker at the due schedules kept as data: how soon a
schedule added, changed, paused or removed takes effect on every replica."""
