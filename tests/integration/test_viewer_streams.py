"""The reads a page holds open, in a real headless Chromium against `looptrace serve` (issue 55;
api/cross_site.py, api/viewer/sessions.py): a page of another origin (another port of the host, or
another site) cannot open the Responses WebSocket of a server without keys, nor read its live feed,
while the viewer's own page can; and the viewer's live feed, opened with its login's cookie, is cut
within a second or so when that login ends on the server, and the page says so ("locked")."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore
from looptrace.trace_store.location import open_state

from browser import Page

MODEL = "tiny-qwen"
SECRET = "viewer-streams-secret"

SOCKET = """async (url) => await new Promise((resolve) => {
  const socket = new WebSocket(url);
  socket.onopen = () => { socket.close(); resolve("open"); };
  socket.onerror = () => resolve("refused");
  setTimeout(() => resolve("no answer"), 10000);
})"""
FEED = """async (url) => {
  try {
    const response = await fetch(url, {credentials: "include", headers: {Accept: "text/event-stream"}});
    return "read " + response.status;
  } catch (err) { return "refused"; }
}"""


class Elsewhere:
    """Another origin: a page served from another port, which scripts point at looptrace."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b"<!doctype html><title>elsewhere</title><p>another site"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def elsewhere():
    found = Elsewhere()
    yield found
    found.close()


@pytest.fixture
def page(browser):
    p = Page(browser)
    yield p
    assert p.errors == [], f"JavaScript errors in the page: {p.errors}"
    p.close()


def _replay(folder, *texts: str):
    replay = folder / "steps.jsonl"
    replay.write_text("".join(json.dumps({"text": f"\n</think>\n\n{t}<|im_end|>"}) + "\n" for t in texts))
    return str(replay)


@pytest.fixture(scope="module")
def open_server(serve, qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("streams-open")
    return serve(str(qwen3_5_dir), "--backend", "replay", "--replay", _replay(folder, "one.", "two."),
                 "--served-model-name", MODEL, "--trace-db", str(folder / "traces.sqlite3"))


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["another port of the host", "another site"])
def test_a_page_elsewhere_cannot_open_the_websocket_or_the_feed(open_server, elsewhere, page, host):
    ws = open_server.url.replace("http", "ws") + "/v1/responses"
    p = page.page
    p.goto(f"http://{host}:{elsewhere.port}/")
    assert p.evaluate(SOCKET, ws) == "refused"
    # Its fetch of the feed is refused by looptrace (403) before the browser's CORS rule hides it anyway.
    assert p.evaluate(FEED, open_server.url + "/v1/live") == "refused"
    # The viewer's own page opens both.
    p.goto(open_server.url + "/")
    assert p.evaluate(SOCKET, ws) == "open"
    assert p.evaluate("""async () => {
      const controller = new AbortController();
      const response = await fetch("/v1/live", {headers: {Accept: "text/event-stream"}, signal: controller.signal});
      const first = await response.body.getReader().read();
      controller.abort();
      return response.status + " " + new TextDecoder().decode(first.value);
    }""") == "200 : watching\n\n"


@pytest.fixture(scope="module")
def keyed(serve, qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("streams-keyed")
    store = str(folder / "traces.sqlite3")
    state = open_state(store)
    key = KeyStore(state, SECRET.encode()).create("alice")
    state.close()
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", _replay(folder, "first.", "second."),
                   "--served-model-name", MODEL, "--trace-db", store, env={SECRET_ENV: SECRET})
    return server, key


def _ask(server, key: str, session: str) -> None:
    request = urllib.request.Request(server.url + "/v1/chat/completions", method="POST", data=json.dumps({
        "model": MODEL, "messages": [{"role": "user", "content": "a question"}]}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}", "session_id": session})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200


def test_the_pages_live_feed_is_cut_when_its_login_ends_on_the_server(keyed, page):
    server, key = keyed
    _ask(server, key, "watched")
    p = page.page
    p.goto(server.url + "/")
    p.wait_for_selector("#key-dialog[open]", timeout=10_000)
    p.fill("#key-input", key)
    p.click("#key-form button[type=submit]")
    p.locator('a.session[data-key="alice/watched"]').wait_for(timeout=15_000)
    p.wait_for_selector("#live[data-state=on]", timeout=10_000)
    # The login ends on the server (as in another tab, or at its expiry) while this page still holds the
    # cookie: its open feed is ended, and the page's reconnect is refused.
    (cookie,) = page.context.cookies()
    request = urllib.request.Request(server.url + "/v1/logout", method="POST",
                                     headers={"Cookie": f"{cookie['name']}={cookie['value']}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.loads(response.read())["ended"] is True
    ended = time.monotonic()
    p.wait_for_selector("#live[data-state=locked]", timeout=10_000)
    took = time.monotonic() - ended
    assert took < 3.0, took  # within a second of the logout, then the page's reconnect (half a second)
    print(f"the page's live feed was locked {took:.2f} s after the logout")
    # A step stored now reaches no page.
    _ask(server, key, "unwatched")
    time.sleep(1.0)
    assert p.locator('a.session[data-key="alice/unwatched"]').count() == 0
