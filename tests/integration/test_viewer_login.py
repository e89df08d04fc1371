"""The viewer behind a login, in a real headless Chromium against `looptrace serve` with two tenants' keys
in its store: the page asks for the key once, logs in (POST /v1/login), and shows that tenant's sessions
alone; the browser holds an HttpOnly, SameSite=Strict cookie, no page storage holds the key, and only
the login request carried it; "Log out" ends the session."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore
from looptrace.trace_store.location import open_state

from browser import Page
from waiting import wait_until

MODEL = "tiny-qwen"
SECRET = "viewer-login-secret"


@pytest.fixture(scope="module")
def served(serve, qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("viewer-login")
    store = str(folder / "traces.sqlite3")
    state = open_state(store)
    keys = KeyStore(state, SECRET.encode())  # what `looptrace keys create` does, with the server's secret
    made = {name: keys.create(name) for name in ("alice", "bob")}
    state.close()
    replay = folder / "steps.jsonl"
    replay.write_text("".join(json.dumps({"text": f"\n</think>\n\nNoted for {n}.<|im_end|>"}) + "\n"
                              for n in ("alice", "bob")))
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(replay), "--served-model-name", MODEL,
                   "--trace-db", store, env={SECRET_ENV: SECRET})
    for name, key in made.items():
        request = urllib.request.Request(server.url + "/v1/chat/completions", method="POST", data=json.dumps({
            "model": MODEL, "messages": [{"role": "user", "content": f"{name}'s own question"}]}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}",
                     "session_id": f"{name}-work"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
    return server, made


@pytest.fixture
def page(browser):
    p = Page(browser)
    yield p
    assert p.errors == [], f"JavaScript errors in the page: {p.errors}"
    p.close()


def test_the_page_logs_in_once_and_shows_the_tenants_sessions(served, page, tmp_path):
    server, made = served
    p = page.page
    carried = []  # every request that carried alice's key, anywhere in it
    p.on("request", lambda r: carried.append(r.url) if made["alice"] in (r.url + json.dumps(r.headers) +
                                                                          (r.post_data or "")) else None)
    p.goto(server.url + "/")
    p.wait_for_selector("#key-dialog[open]", timeout=10_000)
    p.fill("#key-input", made["alice"] + "x")
    p.click("#key-form button[type=submit]")
    p.wait_for_selector("#key-error:not([hidden])")
    assert "refused" in p.inner_text("#key-error")
    p.fill("#key-input", made["alice"])
    p.click("#key-form button[type=submit]")
    row = p.locator('a.session[data-key="alice/alice-work"]')
    row.wait_for(timeout=15_000)
    assert p.locator("a.session").count() == 1  # bob's session is not hers to see
    p.screenshot(path=str(tmp_path / "logged-in.png"))
    if os.environ.get("LOOPTRACE_SCREENSHOTS"):
        p.screenshot(path=os.path.join(os.environ["LOOPTRACE_SCREENSHOTS"], "viewer-login.png"))
    # The browser holds the cookie, out of the page's reach; no storage of the page holds the key.
    (cookie,) = page.context.cookies()
    assert cookie["name"] == "looptrace-session" and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert made["alice"] not in cookie["value"]
    assert p.evaluate("document.cookie") == ""
    assert p.evaluate("JSON.stringify([{...sessionStorage}, {...localStorage}])") == "[{},{}]"
    assert carried == [server.url + "/v1/login"] * 2, carried  # the refused try (her key and an "x"), then hers
    # Opening her session reads through the cookie too; then "Log out" ends it, and the page asks again.
    row.click()
    p.locator("li.step").first.wait_for()
    p.click("#key-button")
    p.wait_for_selector("#key-dialog[open]")
    p.click("#key-logout")
    wait_until(lambda: page.context.cookies() == [], 10, what="the session cookie cleared by the logout")
    p.wait_for_selector("#key-dialog[open]", timeout=10_000)  # the list reloads, is refused, and asks again
