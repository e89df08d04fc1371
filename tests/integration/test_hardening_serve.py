"""Bad input is refused in one log line, and the server lives on: what only a real `looptrace serve`
process shows (its own log, its memory, the trace viewer in a real browser). The rest of issues 13 and
31's cases run in this process: tests/unit/test_hardening.py."""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path

import many_items
import pytest

from waiting import wait_until

MODEL = "tiny-qwen"
ASK = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def replayed(serve, qwen3_5_dir, tmp_path_factory):
    replay = tmp_path_factory.mktemp("hardening") / "steps.jsonl"
    replay.write_text((json.dumps({"text": "Fine.<|im_end|>"}) + "\n") * 50)  # one per answer
    return serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(replay), "--served-model-name", MODEL)


def test_a_long_header_is_taken_and_a_longer_one_refused_in_one_log_line(replayed):
    # aiohttp refused any header past 8 KiB with a plain-text 400 and a traceback in the log; past
    # 64 KiB (a header or the URL) it still refuses, now in the API's error shape (issue 31).
    import http.client

    server = replayed
    status, answer = server.post("/v1/chat/completions", {"model": MODEL, "messages": ASK},
                                 headers={"X-Long-Token": "a" * 20_000})
    assert status == 200, answer
    before = server.log().count("refused a malformed HTTP request")
    for path, headers in (("/health", {"X-Longer": "b" * 70_000}), ("/v1/models?q=" + "c" * 70_000, {})):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        connection.request("GET", path, headers=headers)
        refused = connection.getresponse()
        body = refused.read()
        connection.close()
        assert refused.status == 400 and refused.getheader("Content-Type").startswith("application/json"), body
        assert json.loads(body)["error"]["code"] == "invalid_http_request", body
    assert server.get("/health")[0] == 200
    log = server.log()
    assert log.count("refused a malformed HTTP request") - before == 2 and "Traceback" not in log, log[-3000:]


def _status_mb(pid: int, field: str) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1]) / 1024


@pytest.mark.parametrize("kind", ["messages", "tools", "input"])
def test_two_million_small_items_are_refused_in_a_moment_and_a_few_hundred_mb(replayed, kind):
    # 2,000,000 one-character messages took 178 s to refuse, the server's memory peaking at 9.6 GB.
    # Issue 31's goal: a second and a few hundred MB. On this shared machine: 10 s, and 600 MB over the
    # idle server, the body itself (68-180 MB, read whole) included.
    server = replayed
    path, data = many_items.body(kind, 2_000_000, MODEL)
    pid = server.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak so far is forgotten
    idle = _status_mb(pid, "VmRSS")
    started = time.perf_counter()
    status, answer = server.request("POST", path, raw=data, timeout=300)
    seconds = time.perf_counter() - started
    peak = _status_mb(pid, "VmHWM") - idle
    assert status == 400 and answer["error"]["code"] == "too_many_items", answer
    print(f"{kind}: {len(data) / 1e6:.0f} MB refused in {seconds:.2f} s, peak +{peak:.0f} MB")
    assert seconds < 10 and peak < 600, (seconds, peak)


@pytest.mark.parametrize("conversation", ["..", ".", "../x", "a/./b"])
def test_a_session_named_like_a_path_step_opens_in_the_viewer(replayed, browser, conversation):
    # A session whose id is ".." had a link that resolved to "/": browsers resolve "..", and "%2E%2E"
    # as well, however the key is escaped.
    from browser import Page

    server = replayed
    status, answer = server.post("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": f"In session {conversation}"}]}, headers={"session_id": conversation})
    assert status == 200, answer
    wait_until(lambda: any(s["key"] == conversation for s in
                           server.get("/v1/sessions?" + urllib.parse.urlencode({"q": conversation}))[1]["data"]), 15)
    page = Page(browser)
    try:
        p = page.page
        p.goto(server.url + "/")
        link = p.locator(f"a.session[data-key='{conversation}']")
        link.click()
        p.locator("li.step").first.wait_for(timeout=15_000)
        assert f"In session {conversation}" in p.locator("#detail").inner_text()
        opened = p.url
        p.goto(server.url + "/")  # and a link to it opens it, as Grafana's or a colleague's would
        p.goto(opened)
        p.locator("li.step").first.wait_for(timeout=15_000)
        assert f"In session {conversation}" in p.locator("#detail").inner_text()
        assert page.errors == [], page.errors
    finally:
        page.close()
