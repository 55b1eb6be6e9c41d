"""The dashboard's reads: what a page shows, each read bounded by an index and a LIMIT.

Nothing here counts a whole table: counts stop at a cap (the page says "at least"), task
listings walk the id index in windows of at most `WINDOW` rows per page (keyset
pagination: the cursor is the id to continue below), and per-minute counts read the newest
rows of one time index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..model import Attempt, AuditEntry, Claim, TaskError, TaskHistory, TaskRecord
from . import sql, task_queue_sql
from .database import Database
from .rows import attempt_from_row, audit_from_row, claim_from_row, record

WINDOW = 5000
"""Task ids one page of a listing looks at, at most, when no index holds its filter."""
COUNT_CAP = 10000
"""A count stops here (per index it reads): the page shows "10,000+"."""
ERRORS_SHOWN = 50
"""Failed attempts a task's page shows at most (the newest)."""
MINUTE_CAP = 50000
"""Rows of each series a per-minute strip reads at most (the newest)."""


@dataclass(frozen=True)
class TaskPage:
    """One page of a task listing: its rows, the cursor of the next page (None: the end),
    and how many rows the walk looked at."""

    tasks: list[TaskRecord]
    next_cursor: int | None
    scanned: int


@dataclass(frozen=True)
class TaskFilter:
    """What a task listing shows: each field None for "any"."""

    state: str | None = None
    queue: str | None = None
    task: str | None = None
    key: str | None = None
    after: datetime | None = None
    before: datetime | None = None

    def columns(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "queue": self.queue,
            "task": self.task,
            "after": self.after,
            "before": self.before,
        }


class Views:
    """The dashboard's reads on one store."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.dialect = db.dialect

    async def task_page(
        self, where: TaskFilter, cursor: int | None, limit: int, names: Sequence[str]
    ) -> TaskPage:
        """A page of tasks newest first, below id `cursor`; `names`: the task names a key
        is looked up under when the filter names none (the key index leads with the name)."""
        read = self.db.read
        columns = where.columns()
        if where.key is not None:
            looked = [where.task] if where.task is not None else list(names)
            if not looked:
                return TaskPage([], None, 0)
            columns["task"] = None
            stmt = task_queue_sql.keyed_page(looked, where.key, cursor, limit + 1, **columns)
            return self._page([record(r) for r in await read(stmt)], limit, None, 0)
        if where.state in (task_queue_sql.DEAD, task_queue_sql.DISCARDED):
            state = columns.pop("state")
            stmt = task_queue_sql.failed_page(state, cursor, limit + 1, **columns)
            return self._page([record(r) for r in await read(stmt)], limit, None, 0)
        window = task_queue_sql.page_window(cursor, WINDOW)
        floor, scanned = (await read(task_queue_sql.window_floor(window)))[0]
        if not scanned:
            return TaskPage([], None, 0)
        rows = await read(task_queue_sql.page_between(floor, cursor, limit + 1, **columns))
        more = floor if scanned == WINDOW else None
        return self._page([record(r) for r in rows], limit, more, int(scanned))

    @staticmethod
    def _page(found: list[TaskRecord], limit: int, more: int | None, scanned: int) -> TaskPage:
        if len(found) > limit:
            return TaskPage(found[:limit], found[limit - 1].id, scanned)
        return TaskPage(found, more, scanned)

    async def task_errors(self, task_id: int, limit: int = ERRORS_SHOWN) -> TaskHistory:
        """A task's newest `limit` failed attempts, newest first, on the (task_id, id) index;
        no history on a database older than schema 11."""
        if not self.db.has_task_errors:
            return TaskHistory([], kept=False)
        rows = await self.db.read(task_queue_sql.errors_of(task_id, limit + 1))
        found = [TaskError(r.attempt, r.error, r.by, r.at) for r in rows[:limit]]
        return TaskHistory(found, more=len(rows) > limit)

    async def newest_task_id(self) -> int | None:
        """The highest task id, if any."""
        rows = await self.db.read(task_queue_sql.newest_id())
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    async def task_counts(self, cap: int = COUNT_CAP) -> dict[str, int]:
        """Tasks in each state, each count stopping at `cap` (per index it reads)."""
        states = (*_LIVE, *task_queue_sql.FINISHED)
        (row,) = await self.db.read(task_queue_sql.capped_counts(states, cap))
        return {state: int(n or 0) for state, n in zip(states, row, strict=True)}

    async def live_by_queue(self, cap: int = COUNT_CAP) -> dict[str, dict[str, int]]:
        """Available and running tasks by queue (each state's rows read stop at `cap`)."""
        found: dict[str, dict[str, int]] = {}
        for state, queue, n in await self.db.read(task_queue_sql.live_by_queue(_LIVE, cap)):
            found.setdefault(queue, {})[state] = found.get(queue, {}).get(state, 0) + int(n)
        return found

    async def slots(
        self, pairs: Sequence[tuple[str, str]]
    ) -> tuple[dict[tuple[str, str], Claim], dict[tuple[str, str], list[Attempt]]]:
        """The claims and the attempt records of some (job, key) slots, in two reads
        (whatever the number of jobs): what the overview's "last slot" column reads."""
        claims: dict[tuple[str, str], Claim] = {}
        records: dict[tuple[str, str], list[Attempt]] = {}
        for start in range(0, len(pairs), 500):
            chunk = list(pairs[start : start + 500])
            for row in await self.db.read(sql.claims_of_slots(chunk)):
                claims[(row.job, row.key)] = claim_from_row(row)
            for row in await self.db.read(sql.records_of_slots(chunk)):
                records.setdefault((row.job, row.key), []).append(attempt_from_row(row))
        return claims, records

    async def window_records(self, job: str, first: datetime, last: datetime) -> list[Attempt]:
        """The attempt records of a job's slots in [first, last] (alive unknown: False)."""
        rows = await self.db.read(sql.window_records(job, first, last))
        return [attempt_from_row(r) for r in rows]

    async def duplicates_since(self, since: datetime, cap: int = COUNT_CAP) -> int:
        """Duplicate slot attempts recorded since `since` (counting at most `cap`)."""
        if not self.db.has_duplicates:
            return 0
        rows = await self.db.read(sql.duplicates_since(since, cap))
        return int(rows[0][0] or 0)

    async def duplicates_of(self, job: str, keys: Sequence[str]) -> dict[str, int]:
        """How many duplicates of each of these slots of a job were suppressed."""
        if not keys or not self.db.has_duplicates:
            return {}
        rows = await self.db.read(sql.duplicates_of(job, list(keys)))
        return {key: int(n) for key, n in rows}

    async def per_minute(self, since: datetime, cap: int = MINUTE_CAP) -> dict[str, dict[int, int]]:
        """Counts per minute (minutes since the epoch) since `since`, by series: `runs`
        (claims), `failures` (failed, timed out, cancelled attempts), `duplicates`,
        `tasks` (succeeded) and `dead` (tasks that died or were discarded)."""
        minute = self.dialect.epoch_minute
        reads = {
            "runs": sql.claims_by_minute(minute, since, cap),
            "failures": sql.records_by_minute(minute, _FAILURES, since, cap),
            "tasks": task_queue_sql.finished_by_minute(
                minute, task_queue_sql.SUCCEEDED, since, cap
            ),
            "dead": task_queue_sql.finished_by_minute(minute, task_queue_sql.DEAD, since, cap),
        }
        if self.db.has_duplicates:
            reads["duplicates"] = sql.duplicates_by_minute(minute, since, cap)
        series: dict[str, dict[int, int]] = {k: {} for k in _SERIES}
        for name, m, n in await self.db.read(sql.series_by_minute(reads)):
            series[name][int(m)] = int(n)
        return series

    async def audit(
        self,
        *,
        job: str | None = None,
        action: str | None = None,
        actor: str | None = None,
        before: int | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """The audit trail newest first, filtered, below id `before`."""
        stmt = sql.audit_page(job, action, actor, before, limit)
        return [audit_from_row(r) for r in await self.db.read(stmt)]


_LIVE = (task_queue_sql.AVAILABLE, task_queue_sql.RUNNING)
_FAILURES = ["failed", "timeout", "cancelled"]
_SERIES = ("runs", "failures", "duplicates", "tasks", "dead")
