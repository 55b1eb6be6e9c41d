"""Credentials out of every message: a URL's password, however it is written.

A database URL can carry a secret in its userinfo (`user:secret@host`, the secret perhaps
with an unencoded `@` or `/`), or in its query string (`?password=…`, which asyncpg accepts,
and other secret-like parameters: sslpassword, token, key, secret …). Masking errs on the side
of hiding: a malformed URL loses more than its password, never less.
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
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def mask_url(url: str) -> str:
    """The URL with every credential it carries replaced by ***, safe for messages and logs.

    The userinfo runs to the URL's last `@` (so an unencoded `@` or `/` in a password is
    hidden with it; the user name before the first `:` stays readable), and secret-like
    query parameters keep their names only.
    """
    head, sep, rest = url.partition("://")
    if not sep:
        # No scheme: treat everything before the last "@" as credentials.
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
    """The text with every URL in it masked by `mask_url`."""
    if "://" not in text:
        return text
    return _URL.sub(lambda m: mask_url(m.group(0)), text)
