"""A Postgres cluster of a test's own, for tests that restart or crash the server.

The shared server at 127.0.0.1:5432 is never restarted by a test: several test processes
(and other people's runs) use it at once. A test that needs a restart creates a cluster on a
free port with Debian's `pg_createcluster`, uses it, and drops it at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PG_CONF = Path("/etc/postgresql")


def available() -> bool:
    """True if this machine can create clusters (Debian's postgresql-common, run as root)."""
    return bool(shutil.which("pg_createcluster")) and PG_CONF.is_dir() and os.geteuid() == 0


@dataclass(frozen=True)
class Cluster:
    version: str
    name: str
    port: int

    @property
    def url(self) -> str:
        """The `postgres` database of the cluster, as a plain postgresql:// URL."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, action: str) -> None:
        """pg_ctlcluster ACTION (start, stop, restart) for this cluster, waiting for it."""
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action],
            check=True,
            capture_output=True,
        )
        if action != "stop":
            self.wait_ready()

    def wait_ready(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ready = subprocess.run(
                ["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)], check=False
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"cluster {self.version}/{self.name} not ready in {timeout}s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def own_cluster(prefix: str = "oncely_test") -> Iterator[Cluster]:
    """A new, running cluster (trust auth on 127.0.0.1) on a free port; dropped afterwards."""
    version = sorted(os.listdir(PG_CONF))[-1]
    port = free_port()
    cluster = Cluster(version, f"{prefix}_{os.getpid()}_{port}", port)
    subprocess.run(
        ["pg_createcluster", version, cluster.name, "-p", str(port), "--", "--auth=trust"],
        check=True,
        capture_output=True,
    )
    try:
        cluster.ctl("start")
        yield cluster
    finally:
        subprocess.run(
            ["pg_dropcluster", "--stop", version, cluster.name], check=False, capture_output=True
        )
