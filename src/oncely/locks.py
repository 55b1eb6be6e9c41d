"""Advisory-lock keys: where a slot's and a job's Postgres locks live in the 64-bit key space.

Postgres advisory locks are named by 64 bits. oncely uses the two-int form
(`pg_try_advisory_xact_lock(int4, int4)`), which never meets an application's one-key
(bigint) locks, and fills all 64 bits from BLAKE2b over a tagged name: slots and jobs are
tagged apart, so a slot's lock never equals a job's. Two different names share a key with
probability 2**-64 per pair: among a million live slots, about 3 in 10**8 that any two
ever collide. Job locks (held across a whole run with `overlap="skip"`) are checked for
collisions among an app's registered jobs at registration.
"""

from __future__ import annotations

import hashlib


def _key(tag: str, *parts: str) -> tuple[int, int]:
    name = "\0".join((tag, *parts)).encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(name, digest_size=8).digest()
    return (
        int.from_bytes(digest[:4], "big", signed=True),
        int.from_bytes(digest[4:], "big", signed=True),
    )


def slot_lock_key(job: str, key: str) -> tuple[int, int]:
    """The advisory-lock key of one slot (job, key): two signed 32-bit halves."""
    return _key("slot", job, key)


def job_lock_key(job: str) -> tuple[int, int]:
    """The advisory-lock key that one running slot of `job` holds (`overlap="skip"`)."""
    return _key("job", job)
