"""`oncely web` as a user runs it, in a real process: read-only by default, bound to
127.0.0.1, actions only with --allow-actions and a token (which it refuses to start without)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.support import ROOT, engine_for, run_cli, start_cli
from tests.web.conftest import form_token

APP = "tests.apps.web_app:app"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # LISTEN
                found.append(address)
    return found


def _env(db_url: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "ONCELY_APP": APP, "ONCELY_DATABASE_URL": db_url, **extra}
    env.pop("ONCELY_WEB_TOKEN", None)
    env.update(extra)
    return env


@contextlib.contextmanager
def _serve(db_url: str, *args: str, **extra: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = _free_port()
    proc = start_cli("web", "--port", str(port), *args, env=_env(db_url, **extra))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                if httpx.get(f"{url}/healthz", timeout=1).text == "ok":
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "oncely web did not answer within 30 s"
            time.sleep(0.05)
        yield url, proc
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _rows(db_url: str, query: str) -> list[tuple[object, ...]]:
    engine = engine_for(db_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(query).all()]
    finally:
        engine.dispose()


@pytest.fixture
def migrated(db_url: str) -> str:
    done = run_cli("migrate", cwd=ROOT, env=_env(db_url))
    assert done.returncode == 0, done.stderr
    return db_url


def test_allow_actions_without_a_token_exits_2(migrated: str) -> None:
    done = run_cli("web", "--allow-actions", cwd=ROOT, env=_env(migrated))
    assert done.returncode == 2
    assert "--allow-actions needs a token" in done.stderr
    assert "Traceback" not in done.stderr


def test_serves_read_only_on_127_0_0_1_by_default(migrated: str) -> None:
    with _serve(migrated) as (url, _proc):
        port = int(url.rsplit(":", 1)[1])
        assert _listening(port) == ["0100007F"]  # 127.0.0.1, and nothing else
        page = httpx.get(f"{url}/")
        assert page.status_code == 200 and 'data-job="hourly"' in page.text
        assert 'data-mode="read-only"' in page.text
        login = httpx.get(f"{url}/login")
        cookies, csrf = dict(login.cookies), form_token(login.text)
        r = httpx.post(f"{url}/jobs/hourly/pause", data={"csrf": csrf}, cookies=cookies)
        assert r.status_code == 403
    assert _rows(migrated, "SELECT job FROM oncely_pauses") == []


def test_actions_with_the_token_only(migrated: str) -> None:
    with _serve(migrated, "--allow-actions", ONCELY_WEB_TOKEN="t0ken-xyz") as (url, _proc):
        page = httpx.get(f"{url}/login")
        form, cookies = {"csrf": form_token(page.text)}, dict(page.cookies)
        wrong = {"Authorization": "Bearer nope"}
        r = httpx.post(f"{url}/jobs/hourly/pause", data=form, cookies=cookies, headers=wrong)
        assert r.status_code == 401
        right = {"Authorization": "Bearer t0ken-xyz"}
        r = httpx.post(f"{url}/jobs/hourly/pause", data=form, cookies=cookies, headers=right)
        assert r.status_code == 303
        assert "t0ken-xyz" not in httpx.get(f"{url}/audit", headers=right).text
    rows = _rows(migrated, "SELECT action, actor FROM oncely_audit")
    assert rows == [("pause", "web:token@127.0.0.1")]


def test_a_host_other_than_the_bound_one_is_refused(migrated: str) -> None:
    """DNS rebinding: a page whose own name now resolves to 127.0.0.1 sends its name as
    Host; the server answers it nothing but 400 (and what it was bound to, as usual)."""
    with _serve(migrated, "--allowed-host", "board.example") as (url, _proc):
        port = url.rsplit(":", 1)[1]
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.2", "localhost.evil"):
            r = httpx.get(f"{url}/", headers={"Host": host})
            assert r.status_code == 400 and 'data-job="hourly"' not in r.text, host
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "board.example", "[::1]"):
            r = httpx.get(f"{url}/", headers={"Host": host})
            assert r.status_code == 200 and 'data-job="hourly"' in r.text, host
