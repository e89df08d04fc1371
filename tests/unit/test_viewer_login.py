"""The viewer behind a login (issue 55 item 5; api/viewer/login.py, session_cookie.py, api/cross_site.py),
through the real application on both stores: the page hands a key to POST /v1/login once and holds a
session cookie instead (HttpOnly, SameSite=Strict, Path=/; an opaque token the store keeps only the
digest of), which reads its key's tenant's sessions alone and ends on logout and with its key; a
state-changing request from another site's page is refused, the same from an agent's key is not."""

from __future__ import annotations

import http.client
import json
import uuid
from http.cookies import SimpleCookie

import pytest

from looptrace.proxy.api.clients import ROLLOUT_PREFIX
from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.settings import Settings
from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore, server_secret

import hostile_tenant
import stores as store_kinds
from app_thread import AppThread
from waiting import wait_until

MODEL = "tiny-qwen"
MARKER = "guava-" + uuid.uuid4().hex[:12]
OPERATOR = "operator-key"


class Answer:
    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status = response.status
        self.body = response.read()
        self.set_cookie = response.headers.get_all("Set-Cookie") or []

    def json(self) -> dict:
        return json.loads(self.body)

    def cookie(self) -> str | None:
        found = SimpleCookie("\n".join(self.set_cookie)).get("looptrace-session")
        return found.value if found is not None else None


def send(app, method: str, path: str, body=None, *, key: str | None = None, cookie: str | None = None,
         headers: dict | None = None, raw: bytes | None = None) -> Answer:
    sent = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    if cookie is not None:
        sent["Cookie"] = f"looptrace-session={cookie}"
    data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
    connection = http.client.HTTPConnection("127.0.0.1", app.port, timeout=60)
    try:
        connection.request(method, path, body=data, headers=sent)
        return Answer(connection.getresponse())
    finally:
        connection.close()


def same_origin(app) -> dict:
    """What a browser adds to a request the viewer's own page sends."""
    return {"Origin": app.url, "Sec-Fetch-Site": "same-origin"}


def logged_in(app, key: str) -> str:
    answer = send(app, "POST", "/v1/login", {"key": key}, headers=same_origin(app))
    assert answer.status == 200 and answer.cookie(), (answer.status, answer.body)
    return answer.cookie()


@pytest.fixture(scope="module", params=store_kinds.KINDS)
def server(request, qwen3_5_dir, tmp_path_factory):
    """The local backend (a fork really runs), --api-key for the operator, and keys in the store."""
    folder = tmp_path_factory.mktemp("login")
    made = store_kinds.of_param(request, folder)
    setting = str(folder / "store" / "traces.sqlite3") if made.kind == "sqlite" else made.setting()
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SECRET_ENV, "login-test-secret")  # never this machine's own secret file
        app = AppThread(Settings(model=str(qwen3_5_dir), served_model_name=MODEL, trace_db=setting,
                                 api_key=OPERATOR)).start()
        keys = KeyStore(app.app[TELEMETRY].state, server_secret())
        made_keys = {name: keys.create(name) for name in ("alice", "bob", "brief")}
        made_keys["agent-only"] = keys.create("agent-only", scopes=("infer",))
        yield app, keys, made_keys, made.kind, folder
        app.stop()
    made.close()


@pytest.fixture(scope="module")
def sessions(server):
    """alice's session (MARKER in its prompt) and bob's, written with their keys as agents send them."""
    app, _, made, _, _ = server
    for name, text in (("alice", MARKER), ("bob", "plain words")):
        answer = send(app, "POST", "/v1/chat/completions", {"model": MODEL, "max_tokens": 4, "temperature": 0,
                                                            "messages": [{"role": "user", "content": text}]},
                      key=made[name], headers={"session_id": f"{name}-session"})
        assert answer.status == 200, answer.body
    app.settled()
    found = {}
    for name in ("alice", "bob"):
        (session,) = send(app, "GET", "/v1/sessions", key=made[name]).json()["data"]
        found[name] = session
    stored = send(app, "POST", "/v1/responses", {"model": MODEL, "input": f"keep {MARKER}", "store": True,
                                                "max_output_tokens": 4}, key=made["alice"],
                  headers={"session_id": "alice-session"})
    assert stored.status == 200, stored.body
    found["alice"]["response_id"] = stored.json()["id"]
    app.settled()
    return found


def test_login_sets_an_http_only_strict_cookie_that_is_not_the_key(server):
    app, keys, made, kind, folder = server
    answer = send(app, "POST", "/v1/login", {"key": made["alice"]}, headers=same_origin(app))
    assert answer.status == 200, answer.body
    assert answer.json() | {"expires_at": 0} == {"object": "login", "name": "alice", "tenant": "alice",
                                                 "scopes": ["infer", "traces:read"], "expires_at": 0}
    (line,) = answer.set_cookie
    morsel = SimpleCookie(line)["looptrace-session"]
    assert morsel["httponly"] and morsel["samesite"] == "Strict" and morsel["path"] == "/", line
    assert not morsel["secure"], line  # plain http here: a Secure cookie would never come back
    assert int(morsel["max-age"]) > 3600
    token = morsel.value
    assert len(token) >= 43 and made["alice"] not in line and token not in answer.body.decode()
    if kind == "sqlite":  # the store holds its digest, never the token or the key
        for path in (p for p in (folder / "store").iterdir() if p.is_file()):
            data = path.read_bytes()
            assert token.encode() not in data and made["alice"].encode() not in data, path


@pytest.mark.parametrize("body", [{"key": "lt-" + "x" * 43}, {"key": "operator-kez"}, {"key": " "}, {}, {"key": 7},
                                  None])
def test_a_wrong_key_gets_a_refusal_and_no_cookie(server, body):
    app = server[0]
    answer = send(app, "POST", "/v1/login", body, headers=same_origin(app))
    assert answer.set_cookie == [] and answer.status in (400, 401), (answer.status, answer.body)
    error = answer.json()["error"]
    if isinstance(body, dict) and isinstance(body.get("key"), str):  # a key, refused
        assert answer.status == 401 and error["code"] == "invalid_api_key", error
    else:
        assert answer.status == 400 and error["type"] == "invalid_request_error", error


def test_a_key_that_cannot_read_traces_opens_no_session(server):
    app, _, made, _, _ = server
    answer = send(app, "POST", "/v1/login", {"key": made["agent-only"]}, headers=same_origin(app))
    assert answer.status == 403 and answer.json()["error"]["code"] == "missing_scope" and not answer.set_cookie


def test_the_cookie_reads_its_tenants_sessions_and_only_them(server, sessions):
    app, _, made, _, _ = server
    bobs = logged_in(app, made["bob"])
    listed = send(app, "GET", "/v1/sessions", cookie=bobs)
    assert listed.status == 200 and [s["key"] for s in listed.json()["data"]] == [sessions["bob"]["key"]]
    assert MARKER.encode() not in listed.body
    hers = sessions["alice"]
    for path in (f"/v1/sessions/{hers['key']}", f"/v1/traces/{hers['last_trace_id']}",
                 f"/v1/traces/{hers['last_trace_id']}/prompt", f"/v1/traces?q={MARKER}"):
        answer = send(app, "GET", path, cookie=bobs)
        assert MARKER.encode() not in answer.body and answer.status in (200, 404), (path, answer.status)
    alices = logged_in(app, made["alice"])
    assert MARKER.encode() in send(app, "GET", f"/v1/sessions/{hers['key']}", cookie=alices).body
    operators = logged_in(app, OPERATOR)  # --api-key: the operator, every tenant
    assert len(send(app, "GET", "/v1/sessions", cookie=operators).json()["data"]) == 2
    # The APIs agents call take a key, never the cookie (a WebSocket there obeys no same-origin rule).
    chat = send(app, "POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                cookie=alices, headers=same_origin(app))
    assert chat.status == 401, chat.body
    assert send(app, "GET", "/v1/models", cookie=alices).status == 401


def test_another_tenants_cookie_reads_nothing_of_hers_on_any_route(server, sessions):
    # The hostile-tenant table (hostile_tenant.py) again, bob holding his login's cookie instead of his key.
    app, _, made, _, _ = server
    hers = sessions["alice"]
    ids = {"session": hers["key"], "trace_id": hers["last_trace_id"], "response_id": hers["response_id"]}
    headers = {"Cookie": f"looptrace-session={logged_in(app, made['bob'])}", **same_origin(app)}
    leaked = []
    for route in hostile_tenant.GUARDED:
        if route.path == "/v1/live":
            continue  # a stream with no end; it filters as the key's does (test_tenants.py watches it)
        for prefix in ("", ROLLOUT_PREFIX) if route.rollout else ("",):
            path = hostile_tenant.path_of(prefix + route.path, ids)
            for query in ("", f"?key={ids['session']}", f"?a={ids['session']}&b={ids['session']}", f"?q={MARKER}"):
                for body in hostile_tenant.bodies(ids) if route.method == "POST" else [None]:
                    answer = send(app, route.method, path + (query if route.method == "GET" else ""), body,
                                  headers={**headers, "session_id": ids["session"]})
                    if MARKER.encode() in answer.body:
                        leaked.append((route.method, path + query, answer.status, answer.body[:300]))
    assert not leaked, leaked
    # Her records are there, whole, for her own key: what he did not read was there to read.
    inputs = send(app, "GET", f"/v1/responses/{ids['response_id']}/input_items", key=made["alice"])
    assert MARKER.encode() in inputs.body


def test_logout_ends_the_session(server, sessions):
    app, _, made, _, _ = server
    cookie = logged_in(app, made["alice"])
    assert send(app, "GET", "/v1/sessions", cookie=cookie).status == 200
    out = send(app, "POST", "/v1/logout", cookie=cookie, headers=same_origin(app))
    assert out.status == 200 and out.json() == {"object": "logout", "ended": True}, out.body
    (cleared,) = out.set_cookie
    assert SimpleCookie(cleared)["looptrace-session"]["max-age"] == "0", cleared
    # The browser forgets it; one that kept it is refused, by this worker at once, by others within a second.
    refused = send(app, "GET", "/v1/sessions", cookie=cookie)
    assert refused.status == 401 and "ended" in refused.json()["error"]["message"], refused.body
    assert send(app, "POST", "/v1/logout", cookie=cookie, headers=same_origin(app)).json()["ended"] is False


def test_revoking_the_key_ends_its_sessions(server, sessions):
    app, keys, made, _, _ = server
    cookie = logged_in(app, made["brief"])
    assert send(app, "GET", "/v1/sessions", cookie=cookie).status == 200
    assert keys.revoke("brief")
    refused = wait_until(lambda: (lambda a: a if a.status == 401 else None)(send(app, "GET", "/v1/sessions",
                                                                                 cookie=cookie)),
                         timeout=5, every=0.1, what="the revoked key's session refused")
    assert "revoked" in refused.json()["error"]["message"]
    assert send(app, "POST", "/v1/login", {"key": made["brief"]}, headers=same_origin(app)).status == 401


FROM_ELSEWHERE = [{"Sec-Fetch-Site": "cross-site"}, {"Origin": "http://evil.example"},
                  {"Origin": "null"}, {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"}]


@pytest.mark.parametrize("elsewhere", FROM_ELSEWHERE, ids=lambda h: " ".join(f"{k}={v}" for k, v in h.items()))
def test_a_state_changing_request_from_another_site_is_refused(server, sessions, elsewhere):
    app, _, made, _, _ = server
    hers = sessions["alice"]
    cookie = logged_in(app, made["alice"])
    operators = logged_in(app, OPERATOR)
    fork = f"/v1/traces/{hers['last_trace_id']}/fork"
    for method, path, body, cookie_of in (("POST", fork, {"index": 0, "token_id": 1, "max_tokens": 2}, cookie),
                                          ("DELETE", f"/v1/sessions/{hers['key']}", None, operators),
                                          ("POST", "/v1/logout", None, cookie),
                                          ("POST", "/v1/login", {"key": made["alice"]}, None)):
        answer = send(app, method, path, body, cookie=cookie_of, headers=elsewhere)
        assert answer.status == 403, (method, path, answer.status, answer.body)
        assert answer.json()["error"]["code"] == "cross_site_request" and not answer.set_cookie
        assert b"evil" not in answer.body  # the client's header is not repeated
    # A form another page posts (text/plain needs no preflight) is refused the same way.
    form = send(app, "POST", fork, raw=b'{"index": 0, "token_id": 1}=', cookie=cookie,
                headers={**elsewhere, "Content-Type": "text/plain"})
    assert form.status == 403 and form.json()["error"]["code"] == "cross_site_request", form.body
    # Nothing was erased, and the session still reads.
    assert send(app, "GET", f"/v1/sessions/{hers['key']}", cookie=cookie).status == 200


def test_the_same_requests_with_a_key_in_a_header_or_from_the_page_itself_run(server, sessions):
    app, _, made, _, _ = server
    hers = sessions["alice"]
    fork = f"/v1/traces/{hers['last_trace_id']}/fork"
    body = {"index": 0, "token_id": 1, "max_tokens": 2}
    by_agent = send(app, "POST", fork, body, key=made["alice"], headers=FROM_ELSEWHERE[0] | FROM_ELSEWHERE[1])
    assert by_agent.status == 200, by_agent.body
    assert by_agent.json()["looptrace"]["forked_from"]["trace_id"] == hers["last_trace_id"]
    by_page = send(app, "POST", fork, body, cookie=logged_in(app, made["alice"]), headers=same_origin(app))
    assert by_page.status == 200, by_page.body
    # An agent's request carries no Origin and no Sec-Fetch-Site at all.
    assert send(app, "POST", fork, body, key=made["alice"]).status == 200


def test_an_erasure_from_the_page_runs_and_one_from_an_agents_key_anywhere_does(server, sessions):
    app, _, made, _, _ = server
    operators = logged_in(app, OPERATOR)
    bobs = sessions["bob"]["key"]
    erased = send(app, "DELETE", f"/v1/sessions/{bobs}", key=OPERATOR, headers=FROM_ELSEWHERE[0])
    assert erased.status == 200 and erased.json()["object"] == "session.erased", erased.body
    again = send(app, "DELETE", f"/v1/sessions/{bobs}", cookie=operators, headers=same_origin(app))
    assert again.status == 404 and again.json()["error"]["code"] == "session_not_found", again.body


@pytest.fixture(scope="module")
def open_server(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("open")
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "none.jsonl"),
                             served_model_name=MODEL, trace_db=str(folder / "traces.sqlite3"))).start()
    yield app
    app.stop()


def test_a_server_without_keys_refuses_a_cross_site_form_post(open_server):
    # Issue 55's report: a server with no key served a chat another site's page posted as text/plain.
    app = open_server
    app.replay("\n</think>\n\nserved.<|im_end|>")
    chat = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    refused = send(app, "POST", "/v1/chat/completions", raw=chat,
                   headers={"Content-Type": "text/plain", "Origin": "http://evil.example",
                            "Sec-Fetch-Site": "cross-site"})
    assert refused.status == 403 and refused.json()["error"]["code"] == "cross_site_request", refused.body
    served = send(app, "POST", "/v1/chat/completions", raw=chat)  # an agent: no Origin, no Sec-Fetch-Site
    assert served.status == 200 and "served." in served.json()["choices"][0]["message"]["content"], served.body
    # The page needs no login there; a key sent to it is refused, and sets nothing.
    assert send(app, "GET", "/v1/sessions").status == 200
    wrong = send(app, "POST", "/v1/login", {"key": "anything"}, headers=same_origin(app))
    assert wrong.status == 401 and not wrong.set_cookie
