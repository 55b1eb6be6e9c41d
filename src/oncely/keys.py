"""Idempotency keys for the outside world: a payment API's `Idempotency-Key`, an e-mail id.

A crash between a provider call and the commit makes the retry call the provider again; a
provider that deduplicates on a key we derive from the same inputs applies it once.

Format (stable across versions, processes and machines)::

    ok1_<32 lowercase hex digits>

the first 128 bits of SHA-256 over the parts encoded as a canonical JSON array (UTF-8, no
spaces, no ASCII escaping): a str as itself, an int in decimal, a UUID as
`{"uuid": "<lowercase canonical form>"}`, an aware datetime as `{"t": "<ISO 8601 in UTC>"}`.
36 characters: under Stripe's 255, the oncely ledger's 200, and most
providers' limits. The JSON array keeps parts apart, so ("a:b", "c") and ("a", "b:c") differ;
"1" (a str) and 1 (an int) differ too.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime, timezone

from .errors import BadInputError

PREFIX = "ok1_"
Part = str | int | uuid.UUID | datetime


def _encode(part: object) -> object:
    if isinstance(part, bool):
        raise BadInputError("idempotency_key(): a bool is ambiguous as a key part; use a str")
    if isinstance(part, (str, int)):
        return part
    if isinstance(part, uuid.UUID):
        return {"uuid": str(part)}
    if isinstance(part, datetime):
        if part.tzinfo is None or part.utcoffset() is None:
            raise BadInputError(
                f"idempotency_key(): time {part.isoformat()} has no UTC offset; pass an aware time"
            )
        return {"t": part.astimezone(timezone.utc).isoformat()}
    raise BadInputError(
        f"idempotency_key(): parts must be str, int, UUID or an aware datetime, "
        f"not {type(part).__name__}"
    )


def idempotency_key(*parts: Part) -> str:
    """A stable, collision-resistant key for these parts, e.g. ("charge", order_id).

    The same parts give the same key in any process, on any machine, in any later version of
    oncely (the `ok1_` prefix names the format); different parts give different keys.
    """
    if not parts:
        raise BadInputError("idempotency_key() needs at least one part, e.g. ('charge', 42)")
    canonical = json.dumps(
        [_encode(p) for p in parts], ensure_ascii=False, separators=(",", ":"), sort_keys=True
    )
    return PREFIX + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]
