"""Credentials out of every message: a URL's password, however it is written.

A database URL can carry a secret in its userinfo (`user:secret@host`, the secret perhaps
with an unencoded `@` or `/`), or in its query string (`?password=…`, which asyncpg accepts,
and other secret-like parameters: sslpassword, token, key, secret …); a libpq key/value DSN
(`host=db password=secret`) in a `password=` (`sslpassword=`, …) pair, its value bare or
single-quoted. Masking errs on the side of hiding: a malformed URL loses more than its
password, never less. The other query parameters and pairs stay as they were.
"""

from __future__ import annotations

import re

MASK = "***"

# A query parameter whose name looks like a credential, and its value up to the next
# parameter (an unencoded `&` inside the value stays masked unless it starts a `name=`).
_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;][^=&;#\s]*(?:pass|pwd|secret|token|key|auth|credential|signature)"
    r"[^=&;#\s]*=)(?P<value>.*?)(?=&[A-Za-z_][A-Za-z0-9_.-]*=|;|#|$)",
    re.IGNORECASE,
)
# Anything that starts like a URL, up to whitespace (passwords with spaces are not URLs).
_URL = r"[A-Za-z][A-Za-z0-9+.-]*://\S+"
# A key/value pair whose key names a secret (libpq: password, sslpassword), its value a
# single-quoted string (with \\ and \' escapes) or a run of non-blanks.
_PAIR = (
    r"(?<![\w.-])(?P<key>[A-Za-z_]*(?:pass|pwd|secret|token|credential)[A-Za-z_]*\s*=\s*)"
    r"(?P<secret>'(?:[^'\\]|\\.)*'?|[^\s'][^\s]*)"
)
# One pass: a URL is taken whole (its query is masked by mask_url), a pair anywhere else.
_SECRETS = re.compile(f"(?P<url>{_URL})|{_PAIR}", re.IGNORECASE)


def mask_url(url: str) -> str:
    """The URL with every credential it carries replaced by ***, safe for messages and logs.

    The userinfo runs to the URL's last `@` (so an unencoded `@` or `/` in a password is
    hidden with it; the user name before the first `:` stays readable), and secret-like
    query parameters keep their names only.
    """
    head, sep, rest = url.partition("://")
    if not sep:
        # No scheme: a key/value DSN's secret pairs, and everything before the last "@".
        url = mask_secrets(url)
        return f"{MASK}@{url.rpartition('@')[2]}" if "@" in url else url
    rest = _SECRET_PARAM.sub(lambda m: m.group("name") + MASK, rest)
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return f"{head}://{rest}"
    user, colon, _secret = userinfo.partition(":")
    if not colon and ("/" in user or "?" in user):
        user = MASK  # the "@" is past the host: no telling where a user name would end
    return f"{head}://{user}{':' + MASK if colon else ''}@{host}"


def mask_secrets(text: str) -> str:
    """The text with every URL in it masked by `mask_url`, and every secret key/value pair
    (`password=…`, as in a libpq DSN) outside a URL masked to `password=***`."""
    if "://" not in text and "=" not in text:
        return text
    return _SECRETS.sub(_mask_match, text)


def _mask_match(match: re.Match[str]) -> str:
    url = match.group("url")
    if url is not None:
        return mask_url(url)
    return match.group("key") + MASK
