"""The token that allows actions: a wrong one is refused and changes nothing; the login
form's session cookie is HttpOnly and SameSite=Strict; `Authorization: Bearer` works too."""

from __future__ import annotations

from tests.web.conftest import Web, attrs, error_text

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
    assert (await wrong.post("/jobs/hourly/pause")).status_code == 403
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
