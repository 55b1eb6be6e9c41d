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

    def ctl(self, action: str, mode: str | None = None, *, wait: bool = True) -> None:
        """pg_ctlcluster ACTION (start, stop, restart) for this cluster, in shutdown `mode`
        (smart, fast, immediate) if given, then waiting for it to accept connections (unless
        `wait` is false or it was stopped)."""
        argv = ["pg_ctlcluster", "--skip-systemctl-redirect"]
        argv += ["--mode", mode] if mode is not None else []
        subprocess.run([*argv, self.version, self.name, action], check=True, capture_output=True)
        if action != "stop" and wait:
            self.wait_ready()

    def hold_starting_up(self) -> None:
        """Stop the server at once (`-m immediate`, if it runs) and start it in a recovery
        that does not end: a standby with `hot_standby = off` and nothing to replay refuses
        every connection with SQLSTATE 57P03 ("the database system is not accepting connections")
        until `promote`, as a server starting up does for a moment."""
        conf = PG_CONF / self.version / self.name / "postgresql.conf"
        if "hot_standby = off" not in conf.read_text():
            with conf.open("a") as out:
                out.write("\nhot_standby = off\n")
        stop = ["pg_ctlcluster", "--skip-systemctl-redirect", "--mode", "immediate"]
        subprocess.run([*stop, self.version, self.name, "stop"], check=False, capture_output=True)
        data = Path(f"/var/lib/postgresql/{self.version}/{self.name}")
        (data / "standby.signal").touch()
        shutil.chown(data / "standby.signal", "postgres", "postgres")
        self.ctl("start", wait=False)

    def promote(self) -> None:
        """End the recovery `hold_starting_up` began: the server accepts connections again."""
        self.ctl("promote")

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
