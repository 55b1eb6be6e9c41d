"""What the toolkit delivers: a job slot, a once-handler call, and (plugged in) a queue task.

A target is anything with `describe()`, `to_spec()` and `async deliver() -> Delivery`. The
spec is JSON that `target_from_spec` turns back into the same target in a child process, so
the toolkit can deliver it from real processes and SIGKILL one. A new kind of target (the
task queue's) registers its rebuilder with `register_target_kind`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from .. import clock
from ..app import Oncely
from ..effects import EffectResult, OnceHandler
from ..errors import BadInputError
from ..model import RunResult, RunStatus

RETURNED = "returned"
"""The status of a delivery of a handler that is not oncely's: it returned, and reported no
claim (ran or skipped): its effects say whether it took effect."""


@dataclass(frozen=True)
class Delivery:
    """What one delivery of a target came to."""

    status: str
    """`ran`, `skipped`, `busy`, `failed` (the target raised: rolled back), `crashed`
    (stopped between its work and its commit by the toolkit), or `returned` (a handler that
    is not oncely's returned: whether it took effect only the `effects` count can say)."""
    key: str | None = None
    """The ledger key the delivery claimed or found, when the target reports one."""
    error: str | None = None
    pid: int | None = None
    """The process that delivered it (a child's pid, or this process's)."""
    exit_code: int | None = None
    """For a child process: how it exited (-9 after the toolkit's SIGKILL)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (children report deliveries this way)."""
        return {
            "status": self.status,
            "key": self.key,
            "error": self.error,
            "pid": self.pid,
            "exit_code": self.exit_code,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Delivery:
        """The Delivery `to_json` described."""
        return cls(
            status=str(data["status"]),
            key=data.get("key"),
            error=data.get("error"),
            pid=data.get("pid"),
            exit_code=data.get("exit_code"),
        )


@runtime_checkable
class Target(Protocol):
    """Something that can be delivered (run) once per call, in this process or in a child."""

    def describe(self) -> str:
        """A short human description for assertion messages."""

    def to_spec(self) -> dict[str, Any]:
        """JSON that `target_from_spec` rebuilds this target from, in another process."""

    async def deliver(self) -> Delivery:
        """Run it once here and report the outcome (the target's errors become `failed`)."""


_KINDS: dict[str, Callable[[dict[str, Any]], Target]] = {}


def register_target_kind(kind: str, rebuild: Callable[[dict[str, Any]], Target]) -> None:
    """Teach child processes to rebuild targets whose spec has `"kind": kind`."""
    _KINDS[kind] = rebuild


def target_from_spec(spec: dict[str, Any]) -> Target:
    """The target a spec describes (in a child process: imports its module)."""
    try:
        rebuild = _KINDS[spec["kind"]]
    except KeyError:
        raise BadInputError(f"unknown target kind in {spec!r}") from None
    return rebuild(spec)


# -- references: how a child finds the same object --------------------------------------


def resolve(reference: str) -> Any:
    """The object `module:attr.attr` names."""
    module_name, _, path = reference.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in path.split(".") if path else []:
        obj = getattr(obj, part)
    return obj


def reference(obj: Any) -> str:
    """`module:name` under which a child process can import `obj` (defined at module level)."""
    if isinstance(obj, str):
        return obj
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<locals>" not in qualname:
        with _ignore_lookup_errors():
            if resolve(f"{module}:{qualname}") is obj:
                return f"{module}:{qualname}"
    for name, mod in list(sys.modules.items()):
        if name == "__main__" or mod is None:
            continue
        with _ignore_lookup_errors():
            for attr, value in vars(mod).items():
                if value is obj:
                    return f"{name}:{attr}"
    raise BadInputError(
        f"{obj!r} cannot be found by a child process: define it at module level in an "
        "importable module (or pass 'module:name')"
    )


class _ignore_lookup_errors:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        return exc_type is not None and issubclass(exc_type, Exception)


def database_url(app: Oncely) -> str:
    """The URL of an app's database, password included (children connect with it)."""
    return app.store.url


def _point(app: Oncely, url: str | None) -> None:
    if url is not None and app._store is None:
        app.use_database(url)


# -- a scheduled job's slot -------------------------------------------------------------


class JobSlot:
    """One slot of a scheduled job: delivering it is `app.attempt(job, now)`.

    `now` is fixed when the target is built (default: the current, possibly frozen, time),
    so every delivery goes for the same slot.
    """

    def __init__(self, app: Oncely | str, job: str, now: datetime | None = None) -> None:
        self.app: Oncely = resolve(app) if isinstance(app, str) else app
        self._app_ref = app if isinstance(app, str) else None
        self.job = job
        self.now = now if now is not None else clock.utcnow()
        self.app.registry.job(job)  # unknown job: fail here, not in a child

    def describe(self) -> str:
        return f"job {self.job} at {self.now.isoformat()}"

    def to_spec(self) -> dict[str, Any]:
        return {
            "kind": "job",
            "app": self._app_ref or reference(self.app),
            "job": self.job,
            "now": self.now.isoformat(),
            "database_url": database_url(self.app),
        }

    async def deliver(self) -> Delivery:
        # A test names its slot on purpose, past or future: the toolkit runs it as named.
        result = await self.app.attempt(self.job, self.now, allow_future=True)
        error = f"{type(result.error).__name__}: {result.error}" if result.error else None
        return Delivery(status=result.status.value, key=result.key, error=error, pid=_pid())

    def at(self, now: datetime) -> JobSlot:
        """The same job, fired at another time (a replica waking up later)."""
        return JobSlot(self._app_ref or self.app, self.job, now)


def _job_from_spec(spec: dict[str, Any]) -> Target:
    app = resolve(spec["app"])
    _point(app, spec.get("database_url"))
    return JobSlot(app, spec["job"], datetime.fromisoformat(spec["now"]))


# -- a call of a handler (an @app.once handler, or any function standing in for one) -----


class Call:
    """A call `handler(*args, **kwargs)`, as a queue would deliver a message to it.

    With an `@app.once` handler the outcome is its EffectResult's status (a task body that
    returns `handler(...).status`, a RunStatus, works too); any other function (a handler
    of any queue, idempotent or not) is `returned` when it returns, and the toolkit judges
    it by the `effects` you count. A plain `def` runs in a
    worker thread, so two concurrent deliveries use two connections. Arguments must be JSON
    for deliveries from child processes.
    """

    def __init__(self, handler: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> None:
        self.handler: Callable[..., Any] = resolve(handler) if isinstance(handler, str) else handler
        self._ref = handler if isinstance(handler, str) else None
        self.args = args
        self.kwargs = kwargs

    def describe(self) -> str:
        name = getattr(self.handler, "__qualname__", repr(self.handler))
        return f"{name}(*{self.args!r}, **{self.kwargs!r})"

    def to_spec(self) -> dict[str, Any]:
        app = getattr(self.handler, "app", None)
        return {
            "kind": "call",
            "handler": self._ref or reference(self.handler),
            "args": list(self.args),
            "kwargs": self.kwargs,
            "database_url": database_url(app) if isinstance(app, Oncely) else None,
        }

    async def deliver(self) -> Delivery:
        try:
            if _is_async(self.handler):
                outcome = await self.handler(*self.args, **self.kwargs)
            else:
                outcome = await asyncio.to_thread(self.handler, *self.args, **self.kwargs)
        except Exception as exc:
            return Delivery(
                status="failed", key=self._key(), error=f"{type(exc).__name__}: {exc}", pid=_pid()
            )
        if isinstance(outcome, (EffectResult, RunResult)):
            return Delivery(status=outcome.status.value, key=outcome.key, pid=_pid())
        if isinstance(outcome, RunStatus):  # a task body that returns `handler(...).status`
            return Delivery(status=outcome.value, key=self._key(), pid=_pid())
        return Delivery(status=RETURNED, key=self._key(), pid=_pid())

    def _key(self) -> str | None:
        if isinstance(self.handler, OnceHandler):
            try:
                return self.handler.key_for(*self.args, **self.kwargs)
            except Exception:
                return None
        return None


def _is_async(handler: Any) -> bool:
    if isinstance(handler, OnceHandler):
        return handler.is_async
    return inspect.iscoroutinefunction(handler)


def _call_from_spec(spec: dict[str, Any]) -> Target:
    handler = resolve(spec["handler"])
    app = getattr(handler, "app", None)
    if isinstance(app, Oncely):
        _point(app, spec.get("database_url"))
    return Call(handler, *spec.get("args", []), **spec.get("kwargs", {}))


def _pid() -> int:
    import os

    return os.getpid()


register_target_kind("job", _job_from_spec)
register_target_kind("call", _call_from_spec)
