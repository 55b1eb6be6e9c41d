"""One attempt at one slot: session → lock → claim → call → commit or rollback → RunResult.

The job's work and the slot's claim commit in the same transaction, or neither does. A loser
never waits: the lock is a try-lock, and a slot someone else holds comes back `busy` at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from . import clock, events
from .errors import JobTransactionError
from .model import RunResult, RunStatus
from .registry import Job
from .store import ClaimOutcome, Store, violation
from .store.outcome import claim_landed


async def _call(job: Job, session: AsyncSession, slot: datetime) -> None:
    if job.is_async:
        await job.func(session, slot)  # type: ignore[misc]
    else:
        await session.run_sync(lambda sync_session: job.func(sync_session, slot))
    what = violation(session.sync_session)
    if what is not None:
        # The job swallowed the JobTransactionError; the attempt still must not land.
        raise JobTransactionError(f"the job called {what}() on oncely's session")


async def run_slot(
    store: Store,
    job: Job,
    slot: datetime,
    key: str,
    replica: str,
    *,
    busy_ms: int = 200,
    context: Mapping[str, Any] | None = None,
) -> RunResult:
    """Run one slot of a job once, if nobody has; never raises for the job's own errors.

    `context` adds fields to every event of this attempt (the worker adds `latency_ms`).
    """
    started = time.perf_counter()

    def result(status: RunStatus, **extra: object) -> RunResult:
        return RunResult(
            job=job.name,
            key=key,
            slot=slot,
            status=status,
            duration=time.perf_counter() - started,
            **extra,  # type: ignore[arg-type]
        )

    fields: dict[str, Any] = {
        "job": job.name,
        "key": key,
        "slot": slot.isoformat(),
        "replica": replica,
        # Fire latency: how late this attempt started, against the slot's nominal time.
        "latency_ms": round((clock.utcnow() - slot).total_seconds() * 1000, 1),
        **(context or {}),
    }
    async with store.attempt() as session:
        outcome = await store.lock_and_claim(
            session,
            job.name,
            key,
            slot,
            replica,
            busy_ms=busy_ms,
            exclusive=job.overlap == "skip",
        )
        if outcome is ClaimOutcome.BUSY:
            await store.abandon(session)
            events.emit("run.busy", "another process is running this slot", **fields)
            return result(RunStatus.BUSY)
        if outcome is ClaimOutcome.OVERLAP:
            await store.abandon(session)
            events.emit(
                "run.overlap_skipped",
                "another slot of this job is still running; not started (overlap=skip)",
                **fields,
            )
            return result(RunStatus.OVERLAP)
        if outcome is ClaimOutcome.TAKEN:
            claim = await store.claim_in(session, job.name, key)
            await store.abandon(session)
            events.emit(
                "run.skipped",
                "already ran, skipping",
                claimed_by=claim.claimed_by if claim else None,
                claimed_at=claim.claimed_at.isoformat() if claim else None,
                **fields,
            )
            return result(RunStatus.SKIPPED, claim=claim)
        try:
            await _call(job, session, slot)
        except Exception as exc:
            await store.abandon(session)
            done = result(RunStatus.FAILED, error=exc)
            events.emit(
                "run.failed",
                "the job raised; rolled back, the slot is free",
                level=logging.ERROR,
                error=f"{type(exc).__name__}: {exc}",
                duration_ms=round(done.duration * 1000, 1),
                **fields,
            )
            return done
        except BaseException:
            await store.abandon(session)
            raise
        try:
            await store.finish(session, job.name, key)
        except Exception as exc:
            await store.abandon(session)
            if store.is_unavailable(exc):  # lost during COMMIT, maybe after it landed
                landed = await claim_landed(store, job.name, key, replica)
                if landed is None:
                    events.emit(
                        "run.unknown",
                        "the connection was lost during COMMIT and the claim cannot be read "
                        "back: the work may or may not have committed",
                        level=logging.ERROR,
                        error=f"{type(exc).__name__}: {exc}",
                        **fields,
                    )
                    return result(RunStatus.UNKNOWN, error=exc)
                if landed:
                    done = result(RunStatus.RAN)
                    events.emit(
                        "run.ran",
                        "ran (the connection was lost during COMMIT; the claim is in the ledger)",
                        duration_ms=round(done.duration * 1000, 1),
                        **fields,
                    )
                    return done
            events.emit(
                "run.failed",
                "the commit failed; rolled back, the slot is free",
                level=logging.ERROR,
                error=f"{type(exc).__name__}: {exc}",
                **fields,
            )
            return result(RunStatus.FAILED, error=exc)
    done = result(RunStatus.RAN)
    events.emit("run.ran", "ran", duration_ms=round(done.duration * 1000, 1), **fields)
    return done
