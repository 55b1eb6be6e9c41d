"""The token that allows actions: a wrong one is refused and changes nothing; the login
form's session cookie is HttpOnly and SameSite=Strict and lives on the server (logout ends
it); `Authorization: Bearer` works too. A POST needs its session's CSRF token and the
dashboard's own origin; every answer forbids framing; wrong tokens are throttled; the error
page stands in for a database that is away."""

from __future__ import annotations

import httpx
import pytest
from tests.apps.web_app import build
from tests.web.conftest import Web, allow_all, attrs, error_text, form_token

from oncely.web import dashboard
from oncely.web.access import LOGIN_FAILURES, LoginThrottle

TOKEN = "correct-horse-battery-staple"


async def test_a_wrong_token_is_refused_and_changes_nothing(web: Web) -> None:
    board = web.board(token=TOKEN)
    form = (await board.get("/login")).text
    assert len(attrs(form, "login")) == 1 and 'name="token"' in form
    before = web.snapshot()
    r = await board.post("/login", token="guess")
    assert r.status_code == 401 and "wrong token" in error_text(r.text)
    assert "oncely_session" not in board.client.cookies
    r = await board.post("/jobs/hourly/pause")
    assert r.status_code == 403
    wrong = web.board(token=TOKEN, headers={"Authorization": "Bearer guess"})
    assert (await wrong.post("/jobs/hourly/pause")).status_code == 401
    assert web.snapshot() == before
    assert TOKEN not in form


async def test_the_login_cookie_allows_actions_as_the_token_holder(web: Web) -> None:
    board = web.board(token=TOKEN)
    r = await board.post("/login", token=TOKEN)
    assert r.status_code == 303
    cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith("oncely_session="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert TOKEN not in cookie  # a MAC of the token, never the token
    assert attrs((await board.get("/")).text, "mode", "data-mode") == ["actions"]
    r = await board.post("/jobs/hourly/pause")
    assert r.status_code == 303
    assert web.audit() == [("pause", "hourly", "web:token@127.0.0.1", "paused")]
    r = await board.post("/logout")
    assert r.status_code == 303
    assert (await board.post("/jobs/hourly/resume")).status_code == 403


async def test_a_bearer_token_allows_actions(web: Web) -> None:
    board = web.board(token=TOKEN, headers={"Authorization": f"Bearer {TOKEN}"})
    assert (await board.post("/jobs/hourly/pause")).status_code == 303
    assert web.rows("SELECT job FROM oncely_pauses") == [("hourly",)]


async def test_login_on_a_dashboard_without_a_token_is_refused(web: Web) -> None:
    board = web.board()
    r = await board.post("/login", token="anything")
    assert r.status_code == 403 and "read-only" in error_text(r.text)
    assert "oncely_session" not in board.client.cookies


async def test_login_without_the_csrf_token_is_refused(web: Web) -> None:
    board = web.board(token=TOKEN)
    r = await board.post("/login", with_csrf=False, token=TOKEN)
    assert r.status_code == 403 and "CSRF" in error_text(r.text)
    assert "oncely_session" not in board.client.cookies


async def test_logout_ends_the_session_on_the_server_so_a_copied_cookie_is_refused(
    web: Web,
) -> None:
    board = web.board(token=TOKEN)
    assert (await board.post("/login", token=TOKEN)).status_code == 303
    copied = board.client.cookies.get("oncely_session")
    assert copied
    thief = web.twin(board)
    thief.client.cookies.set("oncely_session", copied)
    assert attrs((await thief.get("/")).text, "mode", "data-mode") == ["actions"]
    assert (await board.post("/logout")).status_code == 303
    assert attrs((await thief.get("/")).text, "mode", "data-mode") == ["read-only"]
    r = await thief.post("/jobs/hourly/pause")
    assert r.status_code == 403 and "not allowed" in error_text(r.text)
    assert web.rows("SELECT job FROM oncely_pauses") == []


async def test_a_cookie_planted_by_another_origin_is_no_csrf_token(web: Web) -> None:
    """The attack of a page on another port of the same host: it can set `oncely_csrf`
    (cookies know no port) and post the same value, or a nonce and token it read with a
    browser of its own; neither is the CSRF token of the operator's session."""
    board = web.board(token=TOKEN)
    assert (await board.post("/login", token=TOKEN)).status_code == 303
    board.client.cookies.set("oncely_csrf", "planted")
    r = await board.post("/jobs/hourly/pause", with_csrf=False, csrf="planted")
    assert r.status_code == 403 and "CSRF" in error_text(r.text)
    attacker = web.twin(board)
    own = form_token((await attacker.get("/login")).text)
    board.client.cookies.set("oncely_csrf", attacker.client.cookies["oncely_csrf"])
    r = await board.post("/jobs/hourly/pause", with_csrf=False, csrf=own)
    assert r.status_code == 403 and "CSRF" in error_text(r.text)
    assert web.rows("SELECT job FROM oncely_pauses") == []
    assert (await board.post("/jobs/hourly/pause")).status_code == 303


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://dash:8421"},
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
    ],
)
async def test_a_post_from_another_origin_is_refused(web: Web, headers: dict[str, str]) -> None:
    board = web.board(permissions=allow_all)
    token = await board.csrf()
    r = await board.client.post("/jobs/hourly/pause", data={"csrf": token}, headers=headers)
    assert r.status_code == 403 and "another origin" in error_text(r.text)
    assert web.rows("SELECT job FROM oncely_pauses") == []
    proxied = {"Origin": "https://jobs.example", "Sec-Fetch-Site": "same-origin"}
    r = await board.client.post("/jobs/hourly/pause", data={"csrf": token}, headers=proxied)
    assert r.status_code == 303  # the browser's word: a proxy rewrote the Host


@pytest.mark.parametrize("path", ["/", "/jobs/hourly", "/tasks", "/login", "/static/oncely.css"])
async def test_every_answer_forbids_framing_and_sniffing(web: Web, path: str) -> None:
    r = await web.board().get(path)
    assert r.status_code == 200
    assert r.headers["x-frame-options"] == "DENY"
    csp = r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
    assert "form-action 'self'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "same-origin"
    refused = await web.board().get("/jobs/nosuch")
    assert refused.status_code == 404 and refused.headers["x-frame-options"] == "DENY"


async def test_wrong_tokens_are_throttled_per_client(web: Web) -> None:
    board = web.board(token=TOKEN)
    answers = [(await board.post("/login", token=f"guess{i}")).status_code for i in range(30)]
    assert answers == [401] * LOGIN_FAILURES + [429] * (30 - LOGIN_FAILURES)
    r = await board.post("/login", token=TOKEN)
    assert r.status_code == 429 and "too many wrong tokens" in error_text(r.text)
    assert "oncely_session" not in board.client.cookies
    other = dashboard(web.app, token=TOKEN)
    transport = httpx.ASGITransport(app=other, client=("127.0.0.9", 1234))
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as neighbour:
        page = await neighbour.get("/login")
        r = await neighbour.post("/login", data={"csrf": form_token(page.text), "token": "x"})
        assert r.status_code == 401  # another client is not blocked by the first one


def test_the_login_throttle_forgets_the_oldest_client_past_its_bound() -> None:
    throttle = LoginThrottle(failures=2, window=60.0, limit=3)
    for client in ("a", "b", "c", "d"):
        throttle.failed(client)
        throttle.failed(client)
    assert len(throttle._seen) == 3
    assert throttle.wait("a") == 0.0  # forgotten
    assert throttle.wait("d") > 50
    throttle.passed("d")
    assert throttle.wait("d") == 0.0


@pytest.mark.parametrize("path", ["/", "/jobs/hourly", "/tasks", "/tasks/1", "/audit"])
async def test_the_error_page_answers_while_the_database_is_away(path: str) -> None:
    app = build("postgresql+asyncpg://app:s3cret-pw@127.0.0.1:9/nosuch")
    transport = httpx.ASGITransport(app=dashboard(app))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as client:
            r = await client.get(path)
    finally:
        await app.aclose()
    assert r.status_code == 503, r.text[:300]
    assert r.headers["content-type"].startswith("text/html")
    text = error_text(r.text)
    assert "s3cret-pw" not in r.text
    assert "reload" in text


async def test_an_unexpected_failure_is_the_error_page_not_a_bare_500(web: Web) -> None:
    def broken(_request: object) -> str:
        raise RuntimeError("the resolver broke")

    board = dashboard(web.app, permissions=broken)
    transport = httpx.ASGITransport(app=board, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as client:
        r = await client.get("/")
    assert r.status_code == 500 and "RuntimeError" in error_text(r.text)
