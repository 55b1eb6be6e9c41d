"""`FakeProvider`: a payment or e-mail API that honours idempotency keys and counts effects.

It keeps its state in a small SQLite file, so a handler running in a child process (one that
the toolkit SIGKILLs) charges the same provider the test then inspects.
"""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FakeProviderError

ENV = "ONCELY_FAKE_PROVIDER"
"""The environment variable `FakeProvider.from_env()` reads (the pytest fixture sets it)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    action TEXT NOT NULL,
    payload TEXT NOT NULL,
    idempotency_key TEXT UNIQUE,
    pid INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY AUTOINCREMENT, idempotency_key TEXT);
CREATE TABLE IF NOT EXISTS faults (
    id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, error TEXT NOT NULL
);
"""


class ProviderError(Exception):
    """The provider failed: a timeout, a 502 (it may or may not have applied the request)."""


@dataclass(frozen=True)
class AppliedEffect:
    """One request the provider applied."""

    id: str
    action: str
    payload: dict[str, Any]
    idempotency_key: str | None
    pid: int
    """The process that sent it."""


class FakeProvider:
    """A stand-in for a payment or e-mail API, shared by every process that opens `path`.

    A request with an idempotency key the provider has seen is not applied again: it returns
    the first response (as real providers do). `applied` counts what was applied, which is
    what a "one effect" test asserts on. `fail_after_apply()` makes the next request apply
    and then fail (the classic lost response); `fail_before_apply()` makes it fail cleanly.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        if path is None:
            fd, name = tempfile.mkstemp(prefix="oncely-provider-", suffix=".db")
            os.close(fd)
            path = name
        self.path = Path(path)
        db = sqlite3.connect(self.path, timeout=30)
        try:
            db.executescript(_SCHEMA)
        finally:
            db.close()

    @classmethod
    def from_env(cls) -> FakeProvider:
        """The provider at `$ONCELY_FAKE_PROVIDER` (set by the `fake_provider` fixture)."""
        path = os.environ.get(ENV)
        if not path:
            raise FakeProviderError(f"${ENV} is not set: use the fake_provider fixture")
        return cls(path)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    # -- the API a handler calls ---------------------------------------------------------

    def apply(
        self, action: str, payload: dict[str, Any] | None = None, *, idempotency_key: str | None
    ) -> dict[str, Any]:
        """Apply one request (or replay the first response for a known key)."""
        body = json.dumps(payload or {}, sort_keys=True)
        response: dict[str, Any] | None = None
        with self._transaction() as db:
            db.execute("INSERT INTO calls (idempotency_key) VALUES (?)", (idempotency_key,))
            fault, error = _take_fault(db)
            if fault != "before":
                response = _replay(db, idempotency_key) or _insert(
                    db, action, body, idempotency_key
                )
        if fault == "before":
            raise error("failed before applying the request")
        if fault == "after":
            raise error("timed out after applying the request (the response was lost)")
        assert response is not None
        return response

    def charge(
        self,
        amount: int,
        *,
        currency: str = "usd",
        idempotency_key: str | None = None,
        **metadata: Any,
    ) -> dict[str, Any]:
        """Charge `amount` (in cents): a payment API. `metadata` (order_id=42) is kept."""
        payload = {"amount": amount, "currency": currency, **metadata}
        return self.apply("charge", payload, idempotency_key=idempotency_key)

    def send_email(
        self, to: str, subject: str, *, idempotency_key: str | None = None, **metadata: Any
    ) -> dict[str, Any]:
        """Send one e-mail: an e-mail API."""
        payload = {"to": to, "subject": subject, **metadata}
        return self.apply("email", payload, idempotency_key=idempotency_key)

    # -- faults --------------------------------------------------------------------------

    def fail_after_apply(self, times: int = 1, *, error: type[Exception] = ProviderError) -> Faults:
        """The next `times` requests are applied, then raise `error` (the response is lost).

        Also a context manager: `with provider.fail_after_apply(): ...` withdraws the faults
        the block did not use up.
        """
        return self._add_faults("after", times, error)

    def fail_before_apply(
        self, times: int = 1, *, error: type[Exception] = ProviderError
    ) -> Faults:
        """The next `times` requests raise `error` without being applied."""
        return self._add_faults("before", times, error)

    def _add_faults(self, kind: str, times: int, error: type[Exception]) -> Faults:
        name = f"{error.__module__}:{error.__qualname__}"
        with self._transaction() as db:
            db.executemany("INSERT INTO faults (kind, error) VALUES (?, ?)", [(kind, name)] * times)
        return Faults(self)

    def clear_faults(self) -> None:
        """Withdraw every pending fault."""
        with self._transaction() as db:
            db.execute("DELETE FROM faults")

    # -- what the test asserts on --------------------------------------------------------

    @property
    def applied(self) -> int:
        """How many requests were applied (replays of a known key are not counted)."""
        with self._transaction() as db:
            return int(db.execute("SELECT count(*) FROM effects").fetchone()[0])

    @property
    def calls(self) -> int:
        """How many requests arrived, replays and failures included."""
        with self._transaction() as db:
            return int(db.execute("SELECT count(*) FROM calls").fetchone()[0])

    def count(self, action: str | None = None, **payload: Any) -> int:
        """How many applied requests match: `count("charge", order_id=42)`."""
        return sum(
            1
            for e in self.effects()
            if (action is None or e.action == action)
            and all(e.payload.get(k) == v for k, v in payload.items())
        )

    def effects(self) -> list[AppliedEffect]:
        """The applied requests, oldest first."""
        with self._transaction() as db:
            rows = db.execute(
                "SELECT id, action, payload, idempotency_key, pid FROM effects ORDER BY id"
            ).fetchall()
        return [AppliedEffect(f"fx_{r[0]}", r[1], json.loads(r[2]), r[3], int(r[4])) for r in rows]

    def assert_applied(self, n: int = 1) -> None:
        """Fail unless exactly `n` requests were applied, listing what was."""
        effects = self.effects()
        if len(effects) != n:
            listed = "; ".join(f"{e.action} {e.payload} key={e.idempotency_key}" for e in effects)
            raise AssertionError(f"expected {n} applied effect(s), got {len(effects)}: {listed}")

    def reset(self) -> None:
        """Forget every request, effect and pending fault."""
        with self._transaction() as db:
            db.execute("DELETE FROM effects")
            db.execute("DELETE FROM calls")
            db.execute("DELETE FROM faults")


class Faults:
    """Pending faults; as a context manager, withdraws those left unused when the block ends."""

    def __init__(self, provider: FakeProvider) -> None:
        self.provider = provider

    def __enter__(self) -> FakeProvider:
        return self.provider

    def __exit__(self, *exc: object) -> None:
        self.provider.clear_faults()


def _error_class(name: str) -> type[Exception]:
    module, _, qualname = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return ProviderError
    return obj if isinstance(obj, type) and issubclass(obj, Exception) else ProviderError


def _take_fault(db: sqlite3.Connection) -> tuple[str | None, type[Exception]]:
    row = db.execute("SELECT id, kind, error FROM faults ORDER BY id LIMIT 1").fetchone()
    if row is None:
        return None, ProviderError
    db.execute("DELETE FROM faults WHERE id = ?", (row[0],))
    return str(row[1]), _error_class(str(row[2]))


def _replay(db: sqlite3.Connection, idempotency_key: str | None) -> dict[str, Any] | None:
    if idempotency_key is None:
        return None
    seen = db.execute(
        "SELECT id, action, payload FROM effects WHERE idempotency_key = ?", (idempotency_key,)
    ).fetchone()
    return _response(seen[0], seen[1], seen[2], replayed=True) if seen is not None else None


def _insert(
    db: sqlite3.Connection, action: str, body: str, idempotency_key: str | None
) -> dict[str, Any]:
    cursor = db.execute(
        "INSERT INTO effects (action, payload, idempotency_key, pid) VALUES (?, ?, ?, ?)",
        (action, body, idempotency_key, os.getpid()),
    )
    return _response(int(cursor.lastrowid or 0), action, body, replayed=False)


def _response(effect_id: int, action: str, payload: str, *, replayed: bool) -> dict[str, Any]:
    return {
        "id": f"fx_{effect_id}",
        "action": action,
        "payload": json.loads(payload),
        "replayed": replayed,
    }
