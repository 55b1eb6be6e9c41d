"""WorkerOptions: what a worker is told to do, checked once, frozen."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .. import config
from ..errors import BadInputError


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInputError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise BadInputError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _not_negative(name: str, value: float) -> float:
    """A number of seconds where 0 means "none here" (`schedule_poll`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInputError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise BadInputError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _count(name: str, value: int, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BadInputError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


@dataclass(frozen=True)
class WorkerOptions:
    """A worker's settings; every default is `oncely.config`'s.

    `jobs` names the jobs the scheduled-job loop runs (None: every registered job; empty:
    none); `concurrency` is the tasks run at once (0: this worker runs no tasks).
    """

    jobs: tuple[str, ...] | None = None
    concurrency: int = config.CONCURRENCY
    lease: float = config.LEASE
    queues: tuple[str, ...] | None = None
    batch: int = config.BATCH
    poll: float = config.POLL
    pool_size: int = config.POOL_SIZE
    shutdown_timeout: float = config.SHUTDOWN_TIMEOUT
    startup_wait: float = config.STARTUP_WAIT
    schedule_poll: float = config.SCHEDULE_POLL
    """Seconds between two looks at the due schedules kept as data (0: none run here)."""
    group: int = config.GROUP
    """With a backlog, up to this many async tasks run one after another in one transaction,
    a savepoint each (Postgres; 1: each task in a transaction of its own)."""

    def __post_init__(self) -> None:
        _count("concurrency", self.concurrency, least=0)
        _count("batch", self.batch)
        _count("pool_size", self.pool_size)
        _count("group", self.group)
        if self.group > config.GROUP_MAX:
            raise BadInputError(f"group must be at most {config.GROUP_MAX}, got {self.group!r}")
        object.__setattr__(self, "lease", _positive("the lease", self.lease))
        object.__setattr__(self, "poll", _positive("poll", self.poll))
        poll = _not_negative("schedule_poll", self.schedule_poll)
        object.__setattr__(self, "schedule_poll", poll)
        if self.queues is not None:
            object.__setattr__(self, "queues", tuple(self.queues) or None)
        if self.jobs is not None:
            object.__setattr__(self, "jobs", tuple(self.jobs))

    @classmethod
    def of(
        cls,
        *,
        jobs: Sequence[str] | None = None,
        concurrency: int = config.CONCURRENCY,
        lease: float | None = None,
        queues: Sequence[str] | None = None,
        batch: int = config.BATCH,
        poll: float = config.POLL,
        pool_size: int = config.POOL_SIZE,
        shutdown_timeout: float = config.SHUTDOWN_TIMEOUT,
        startup_wait: float = config.STARTUP_WAIT,
        schedule_poll: float = config.SCHEDULE_POLL,
        group: int = config.GROUP,
    ) -> WorkerOptions:
        """Options from keyword arguments where None means the default."""
        return cls(
            jobs=tuple(jobs) if jobs is not None else None,
            concurrency=concurrency,
            lease=config.LEASE if lease is None else lease,
            queues=tuple(queues) if queues else None,
            batch=batch,
            poll=poll,
            pool_size=pool_size,
            shutdown_timeout=shutdown_timeout,
            startup_wait=startup_wait,
            schedule_poll=schedule_poll,
            group=group,
        )

    @property
    def prefetch(self) -> int:
        """Leased tasks kept ready beyond the concurrency."""
        return min(self.concurrency, config.PREFETCH)
