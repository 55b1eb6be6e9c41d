"""`oncely run --wait`: a run that found its slot busy waits for the holder's outcome.

The holder either commits (its claim appears: the slot ran elsewhere) or rolls back (the
slot is free again, unclaimed: it failed elsewhere, or its process died). Each poll reads the
claim, and when there is none probes the slot's lock the way an attempt takes it, rolling the
probe back at once, so waiting never claims, never runs the job and never blocks the holder.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass
from datetime import datetime

from .model import Claim
from .registry import Job
from .store import ClaimAnswer, ClaimRequest, Store

POLL = 0.2
"""Seconds between two looks at a busy slot."""


class Held(enum.Enum):
    """How a wait for a busy slot ended."""

    RAN = "ran elsewhere"
    FAILED = "failed elsewhere"
    STILL_BUSY = "still busy"


@dataclass(frozen=True)
class Waited:
    """The holder's outcome, its claim when it ran, and how long the wait took (seconds)."""

    held: Held
    claim: Claim | None
    waited: float


_HOLDER_FAILED = (ClaimAnswer.CLAIMED, ClaimAnswer.GIVEN_UP, ClaimAnswer.RETRY_WAIT)


async def wait_for_holder(
    store: Store, job: Job, slot: datetime, key: str, replica: str, timeout: float
) -> Waited:
    """Poll a busy slot until its holder commits or rolls back, or `timeout` seconds pass."""
    started = time.monotonic()
    while True:
        claim = await store.claims.get_claim(job.name, key)
        if claim is not None:
            return Waited(Held.RAN, claim, time.monotonic() - started)
        async with store.claims.attempt() as session:
            request = ClaimRequest(job=job.name, key=key, scheduled_for=slot, claimed_by=replica)
            answer = await store.claims.lock_and_claim(session, request)
            await store.claims.abandon(session)  # a probe: never keep the claim
        if answer is ClaimAnswer.TAKEN:
            continue  # committed between the read and the probe: read it
        if answer in _HOLDER_FAILED:  # free, given up, or waiting for its retry
            return Waited(Held.FAILED, None, time.monotonic() - started)
        if time.monotonic() - started >= timeout:
            return Waited(Held.STILL_BUSY, None, time.monotonic() - started)
        await asyncio.sleep(POLL)
