"""Seams where the testing toolkit can stop an attempt: after the work, before the commit.

Production code calls `before_commit(job, key)` just before it commits a claim with its work
(the "ack"); no hook is installed outside tests, so it does nothing. `oncely.testing` installs
one to crash an attempt exactly between its work and its commit, in-process or with SIGKILL.
"""

from __future__ import annotations

from collections.abc import Callable

BeforeCommit = Callable[[str, str], None]
_before_commit: list[BeforeCommit] = []


def before_commit(job: str, key: str) -> None:
    """Called with the claim's (job, key) after the work is done, before the commit."""
    for hook in list(_before_commit):
        hook(job, key)


def add_before_commit(hook: BeforeCommit) -> None:
    """Call `hook(job, key)` before every commit of a claim from now on."""
    _before_commit.append(hook)


def remove_before_commit(hook: BeforeCommit) -> None:
    """Stop calling `hook`."""
    if hook in _before_commit:
        _before_commit.remove(hook)
