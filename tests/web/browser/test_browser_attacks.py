"""The dashboard attacked from another origin, in Chromium: a page on another port of the
same host (a second, tiny HTTP server) that plants the CSRF cookie and posts a form, and a
page that frames the dashboard and clicks through. Neither changes anything: each check of
an effect reads the database."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.web.browser.conftest import Site, free_port, login

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def other_origin() -> Iterator[Callable[[str], str]]:
    """`serve(html)`: a URL on another port of 127.0.0.1 answering `html`, which also sets
    the `oncely_csrf` cookie (cookies know no port: the dashboard's host gets it too)."""
    pages: dict[str, str] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, "").encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Set-Cookie", "oncely_csrf=planted; Path=/; SameSite=Strict")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]

    def serve(html: str) -> str:
        path = f"/{len(pages)}"
        pages[path] = html
        return f"http://127.0.0.1:{port}{path}"

    try:
        yield serve
    finally:
        server.shutdown()
        server.server_close()


def paused(site: Site) -> list[str]:
    return [r[0] for r in site.rows("SELECT job FROM oncely_pauses WHERE resumed_at IS NULL")]


def test_a_page_on_another_port_that_plants_the_csrf_cookie_changes_nothing(
    site: Site, page: Any, other_origin: Callable[[str], str]
) -> None:
    login(page, site)
    assert page.get_by_test_id("mode").get_attribute("data-mode") == "actions"
    evil = other_origin(
        f"""<form id="f" method="post" action="{site.url}/jobs/nightly/pause">
        <input name="csrf" value="planted"><input name="reason" value="forged"></form>
        <script>document.getElementById("f").submit()</script>"""
    )
    page.goto(evil)
    page.wait_for_url(f"{site.url}/**")  # the form went to the dashboard: its answer
    assert paused(site) == []
    assert site.rows("SELECT action FROM oncely_audit") == []
    assert page.url == f"{site.url}/jobs/nightly/pause"
    assert "another origin" in page.get_by_test_id("error").inner_text()
    page.goto(f"{site.url}/jobs/nightly")  # the operator's own form still works
    page.get_by_test_id("pause").click()
    page.wait_for_url(f"{site.url}/jobs/nightly")
    assert paused(site) == ["nightly"]


def test_the_dashboard_in_another_origins_frame_does_not_render_nor_click_through(
    site: Site, page: Any, other_origin: Callable[[str], str]
) -> None:
    site.ok("pause", "nightly", "--actor", "ops@test")
    login(page, site)
    evil = other_origin(
        f"""<p>win a prize: click the button</p>
        <iframe id="f" src="{site.url}/jobs/nightly" width="1000" height="500"></iframe>"""
    )
    page.goto(evil)
    page.wait_for_load_state("load")
    frames = [f for f in page.frames if f != page.main_frame]
    assert len(frames) == 1
    assert frames[0].locator("[data-testid=resume]").count() == 0
    assert frames[0].locator("[data-testid=job-name]").count() == 0
    box = page.locator("#f").bounding_box()
    for dx, dy in ((60, 90), (200, 120), (400, 160)):  # where the Resume button would be
        page.mouse.click(box["x"] + dx, box["y"] + dy)
    assert paused(site) == ["nightly"]
    assert [r[0] for r in site.rows("SELECT action FROM oncely_audit")] == ["pause"]
