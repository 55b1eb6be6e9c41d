"""Every public exception oncely raises, under one root.

Each class's docstring is its default message, so ``raise SchemaMissingError()`` already
says what is wrong and how to fix it.
"""

from __future__ import annotations


class OncelyError(Exception):
    """oncely failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip())


class ConfigError(OncelyError):
    """A job, task or schedule was declared wrongly; the message names which one."""


class UnknownJobError(ConfigError):
    """No job is registered under that name."""


class BadInputError(OncelyError):
    """An argument (a time, a key, an option) is malformed; the message says which one."""


class DatabaseUnavailableError(OncelyError):
    """The database could not be reached."""


class SchemaMissingError(OncelyError):
    """oncely's tables are missing or out of date: run `oncely migrate`."""


class JobTransactionError(OncelyError):
    """A job must not commit, roll back or close the session oncely gave it.

    oncely commits the job's work together with the slot's claim; a commit inside the job
    would let work land without the claim (or the claim without the work).
    """


class DatabaseError(OncelyError):
    """A database statement failed."""


class PayloadError(BadInputError):
    """A task's arguments must be JSON: str, int, float, bool, None, lists and str-keyed dicts."""


class UnknownTaskError(ConfigError):
    """No task is registered under that name."""


class TaskStateError(BadInputError):
    """The task is not in a state that allows this operation."""


class SchemaTooNewError(OncelyError):
    """oncely's tables were migrated by a newer oncely than this one: upgrade oncely."""


class DatabaseReadOnlyError(DatabaseError):
    """The database is read-only: oncely must write its claims and tasks there."""


# The builtin second parent keeps `except ValueError` (or TypeError, RuntimeError) working
# for code written before oncely raised its own class there.


class BadTimeError(BadInputError, ValueError):
    """oncely needs a timezone-aware instant (ISO 8601 with a UTC offset)."""


class BadOptionError(BadInputError, ValueError):
    """An option has a value oncely does not know; the message lists the known ones."""


class RetryDecisionError(BadInputError, TypeError):
    """Not a retry policy, or not a decision oncely can read from one."""


class FakeProviderError(ConfigError, RuntimeError):
    """The fake provider is not set up: use the fake_provider fixture."""


class LeaseLostError(OncelyError):
    """The task's ack matched no row: its lease was lost (another worker took it over, it
    was discarded, or it expired), so the attempt's work was rolled back."""


class ResultError(OncelyError):
    """A task's return value cannot be stored: it must be JSON, within the task's size limit."""


class TaskFailedError(OncelyError):
    """The task ended without succeeding (dead or discarded): it has no result."""


class ResultTimeoutError(OncelyError, TimeoutError):
    """The task did not finish within the time `task_result` was given to wait."""


class JobTimeoutError(OncelyError, TimeoutError):
    """The job ran longer than its timeout: it was cancelled and rolled back."""


class JobCancelledError(OncelyError):
    """An operator cancelled the attempt: it was rolled back, the slot is free."""


class TaskCancelledError(OncelyError):
    """An operator cancelled the running task (`oncely tasks cancel`): rolled back, discarded."""


class ScheduleError(BadInputError):
    """A schedule kept as data was given a value oncely cannot use; the message says which."""


class UnknownScheduleError(ScheduleError):
    """No schedule is stored under that name."""
