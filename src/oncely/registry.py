"""Job definitions, validated when they are declared (at import time), with no I/O."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from . import locks
from .errors import ConfigError, UnknownJobError
from .retry import SLOT_POLICY, RetryPolicy
from .schedule import Schedule, default_key
from .store import LEDGER_PREFIX

JobFunc = Callable[[Any, datetime], Awaitable[None] | None]
KeyFunc = Callable[[datetime], str]
AttemptFunc = Callable[..., Awaitable[Any]]
CatchUp = Literal["latest", "all", "none"]
Overlap = Literal["skip", "allow"]

CATCH_UP_CHOICES = ("latest", "all", "none")
OVERLAP_CHOICES = ("skip", "allow")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$")


@dataclass(frozen=True)
class Job:
    """A registered scheduled job: its name, schedule, slot key and the function to call."""

    name: str
    schedule: Schedule
    func: JobFunc
    key_func: KeyFunc | None = None
    catch_up: CatchUp = "latest"
    """Which missed slots the worker runs: the latest, all (oldest first, bounded), or none."""
    grace: timedelta | None = None
    """Slots later than this are not run by the worker but reported missed; None: no limit."""
    overlap: Overlap = "skip"
    """Whether a slot may start while the job's previous slot is still running."""
    timeout: timedelta | None = None
    """An attempt that runs longer is cancelled and rolled back (outcome `timeout`)."""
    attempt: AttemptFunc | None = None
    """How one attempt runs when its transaction is not oncely's session but a framework's
    (Django's): `await attempt(store, job, slot, request)` returns the runner's SlotOutcome.
    None: the runner opens the session, claims, calls `func(db, now)` and commits."""
    retry: RetryPolicy | None = None
    """How a slot whose attempt failed or timed out is retried, its attempts counted across
    the fleet from the recorded attempts of the slot; None: `SLOT_POLICY` (5 attempts from
    3 s); `RetryPolicy(attempts=1)`: given up at its first failure."""

    @property
    def policy(self) -> RetryPolicy:
        """The retry policy a failed slot of this job follows: its own, or the default."""
        return self.retry if self.retry is not None else SLOT_POLICY

    @property
    def is_async(self) -> bool:
        """Whether the function is a coroutine function (else it gets a sync Session)."""
        return inspect.iscoroutinefunction(self.func)

    def key_for(self, slot: datetime) -> str:
        """The ledger key of a slot: the job's `key=` function, or the UTC instant."""
        if self.key_func is None:
            return default_key(slot)
        key = self.key_func(slot)
        problem = key_problem(key)
        if problem is not None:
            raise ConfigError(f"job {self.name!r}: key= must return {problem}")
        return key


MAX_KEY = 200
"""Characters: the longest slot key (oncely_runs.key)."""


def key_problem(key: object) -> str | None:
    """What a slot key must be, with what it is, if `key` is not one (else None): a
    non-empty str of valid UTF-8, at most `MAX_KEY` characters."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY:
        long = isinstance(key, str) and len(key) > MAX_KEY
        shown = f"{str(key)[:40]!r}… ({len(str(key))} characters)" if long else repr(key)
        return f"a non-empty str of at most {MAX_KEY} characters, got {shown:.80}"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return f"a str of valid UTF-8, got {key!r:.80}"
    return None


def _check_signature(name: str, func: Callable[..., Any], arity: int = 2) -> None:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"job {name!r}: cannot read the function's signature") from exc
    try:
        sig.bind(*(object() for _ in range(arity)))
    except TypeError as exc:
        what = "two arguments (db, now)" if arity == 2 else "one argument (now)"
        raise ConfigError(
            f"job {name!r}: the function must accept {what}; its signature is {name}{sig}"
        ) from exc


def _check_policy(name: str, catch_up: object, grace: object, overlap: object) -> None:
    if catch_up not in CATCH_UP_CHOICES:
        raise ConfigError(
            f"job {name!r}: catch_up must be one of {', '.join(CATCH_UP_CHOICES)}, got {catch_up!r}"
        )
    if overlap not in OVERLAP_CHOICES:
        raise ConfigError(
            f"job {name!r}: overlap must be one of {', '.join(OVERLAP_CHOICES)}, got {overlap!r}"
        )
    if grace is not None and (not isinstance(grace, timedelta) or grace <= timedelta(0)):
        raise ConfigError(
            f"job {name!r}: grace must be a positive timedelta or None, got {grace!r}"
        )


def schedule_given(schedule: object, decorator: str = "@app.job") -> None:
    """Refuse a job decorator used bare (`@app.job` over a function, without a schedule):
    it would replace the function and register nothing. ConfigError naming the fix."""
    if callable(schedule) and not isinstance(schedule, Schedule):
        name = getattr(schedule, "__name__", repr(schedule))
        raise ConfigError(
            f"job {name!r}: {decorator} needs a schedule: write {decorator}(every(...)) or "
            f"{decorator}(cron(...)) above the function"
        )


def session_first_signature(func: Callable[..., Any], label: str, usage: str) -> inspect.Signature:
    """The signature of a function that takes the session as its first positional parameter.

    Tasks and once-handlers are declared this way; anything else raises ConfigError
    `"{label}: {usage}; its signature is …"`, at registration.
    """
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{label}: cannot read the function's signature") from exc
    params = list(sig.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigError(f"{label}: {usage}; its signature is {sig}")
    return sig


class Registry:
    """The jobs an app knows, by name."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._lock_keys: dict[tuple[int, int], str] = {}

    def add_job(
        self,
        schedule: Schedule,
        func: JobFunc,
        name: str | None = None,
        key: KeyFunc | None = None,
        *,
        catch_up: str = "latest",
        grace: timedelta | None = None,
        overlap: str = "skip",
        timeout: timedelta | None = None,
        attempt: AttemptFunc | None = None,
        retry: RetryPolicy | None = None,
    ) -> Job:
        """Validate and register a job; raise ConfigError naming the job if anything is off.

        `attempt`: see `Job.attempt` (then `func` is handed the slot's time alone: `f(now)`).
        """
        job_name = self.check_job_name(name or getattr(func, "__name__", ""))
        if not isinstance(schedule, Schedule):
            raise ConfigError(
                f"job {job_name!r}: the schedule must be cron(...) or every(...), got {schedule!r}"
            )
        try:
            schedule.check()
        except ConfigError as exc:
            raise ConfigError(f"job {job_name!r}: {exc}") from exc
        if not callable(func):
            raise ConfigError(f"job {job_name!r}: {func!r} is not callable")
        if key is not None and not callable(key):
            raise ConfigError(f"job {job_name!r}: key= must be a function of the slot time")
        _check_signature(job_name, func, 1 if attempt is not None else 2)
        _check_policy(job_name, catch_up, grace, overlap)
        if timeout is not None and (not isinstance(timeout, timedelta) or timeout <= timedelta(0)):
            raise ConfigError(
                f"job {job_name!r}: timeout must be a positive timedelta or None, got {timeout!r}"
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(f"job {job_name!r}: retry= must be a RetryPolicy, got {retry!r}")
        if job_name in self._jobs:
            raise ConfigError(f"job {job_name!r} is registered twice")
        lock_key = locks.job_lock_key(job_name)
        other = self._lock_keys.get(lock_key)
        if other is not None:
            # Odds 2**-64 per pair; if it ever happens, one would block the other's slots.
            raise ConfigError(
                f"jobs {other!r} and {job_name!r} share one advisory-lock key: rename one of them"
            )
        job = Job(job_name, schedule, func, key, catch_up, grace, overlap, timeout, attempt, retry)  # type: ignore[arg-type]
        self._jobs[job_name] = job
        self._lock_keys[lock_key] = job_name
        return job

    @staticmethod
    def check_name(name: object) -> str:
        """`name` if it is a valid job name; ConfigError saying what one looks like."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(
                f"job name {name!r:.80} is not valid: use letters, digits, _ . : - "
                "(at most 200, starting with a letter or _)"
            )
        return name

    @classmethod
    def check_job_name(cls, name: object) -> str:
        """`name` if a code job may take it: valid, and not under `schedule:`, the prefix
        of the ledger names of schedules kept as data (job `schedule:foo` would claim the
        slots of schedule `foo`). ConfigError otherwise."""
        job_name = cls.check_name(name)
        if job_name.startswith(LEDGER_PREFIX):
            raise ConfigError(
                f"job name {job_name!r:.80} starts with {LEDGER_PREFIX!r}, the prefix of the "
                "ledger names of schedules kept as data: choose another name"
            )
        return job_name

    def job(self, name: str) -> Job:
        """The job registered under `name`; UnknownJobError lists the known ones."""
        try:
            return self._jobs[name]
        except KeyError:
            known = ", ".join(sorted(self._jobs)) or "none registered"
            raise UnknownJobError(f"unknown job {name!r:.80} (known jobs: {known})") from None

    def __iter__(self) -> Iterator[Job]:
        return iter(sorted(self._jobs.values(), key=lambda j: j.name))

    def __len__(self) -> int:
        return len(self._jobs)
