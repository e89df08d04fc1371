"""The trace viewer in a real headless Chromium: a real codex session opened from the sessions list,
tokens and their alternatives, a fork from the page checked against the model itself, escaping of
everything a trace holds, the API key, a step appearing live, and a trace recorded without content."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
import urllib.request

import pytest
import torch
from transformers import AutoModelForCausalLM

import clients
from .test_clients import call, folders, outcome
from browser import Page
from waiting import wait_until

KEY = "sk-viewer-test"
MODEL = "qwen3.5-tiny"
HOSTILE = ("<img src=x onerror=window.__pwned=1> <script>window.__pwned=2</script> "
           "<a href=\"javascript:window.__pwned=3\">link</a> javascript:alert(1) "
           "\u202egnp.exe\u202c zero\u200bwidth \u2066isolate\u2069")
HOSTILE_OUTPUT = ("Thinking about <b>bold</b>.\n</think>\n\n<script>window.__pwned=4</script>\u202eevil\u202c "
                  "<img src=y onerror=window.__pwned=5>" + "<|im_end|>")


@pytest.fixture
def page(browser):
    p = Page(browser)
    yield p
    assert p.errors == [], f"JavaScript errors in the page: {p.errors}"
    p.close()


def api(server, path: str, body: object = None, key: str | None = KEY) -> tuple[int, object]:
    request = urllib.request.Request(server.url + path, data=json.dumps(body).encode() if body is not None else None,
                                     method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def stored(server, path: str, timeout: float = 15) -> object:
    """GET `path` once it answers 200 and, for a trace, is whole (its server span written): the store
    writes a request a moment after its answer."""
    def whole():
        status, body = api(server, path)
        return body if status == 200 and body.get("complete", True) else None
    return wait_until(whole, timeout, what=lambda: f"GET {path} whole: {api(server, path)}")


def enter_key(page, key: str = KEY) -> None:
    page.wait_for_selector("#key-dialog[open]", timeout=10_000)
    page.fill("#key-input", key)
    page.click("#key-form button[type=submit]")


# -- a real codex session, replayed ---------------------------------------------------------------

@pytest.fixture(scope="module")
def codex_session(serve, qwen3_5_dir, tmp_path_factory):
    """codex ran `echo looptrace-ok` through its exec_command tool and answered; the replay server then
    also holds one answer full of markup, for the escaping test."""
    try:
        installed = clients.install()
    except clients.MissingNpm as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))
    tmp = tmp_path_factory.mktemp("codex-viewer")
    steps = ["I will run it.\n</think>\n\n" + call("exec_command", cmd="echo looptrace-ok") + "<|im_end|>",
             "It worked.\n</think>\n\nThe command printed looptrace-ok.<|im_end|>", HOSTILE_OUTPUT]
    replay = tmp / "steps.jsonl"
    replay.write_text("".join(json.dumps({"text": s}) + "\n" for s in steps))
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(replay), "--served-model-name", MODEL,
                   api_key=KEY)
    home, work = folders(tmp)
    clients.codex_home(home, server.base_url, MODEL)
    done = clients.run_codex(installed, home, work, KEY, "Run echo looptrace-ok")
    assert done.returncode == 0, outcome(done)
    def codex_sessions():
        found = [s for s in stored(server, "/v1/sessions")["data"] if s["client"] == "codex_exec"]
        return found if found and found[0]["steps"] >= 2 else None
    (session,) = wait_until(codex_sessions, 15, what="codex's session with both its steps")
    return server, session


def test_a_codex_session_opens_from_the_list_as_its_loop(codex_session, page):
    server, session = codex_session
    p = page.page
    p.goto(server.url + "/")
    enter_key(p)  # the server has --api-key: the page asks before showing anything
    row = p.locator(f'a.session[data-key="{session["key"]}"]')
    row.wait_for()
    assert "codex_exec" in row.inner_text() and "2 steps" in row.inner_text()
    row.click()
    p.wait_for_url(f"**/sessions/{session['key']}")
    steps = p.locator("li.step")
    steps.first.wait_for()
    assert steps.count() == 2
    first, second = steps.nth(0), steps.nth(1)
    # Step 1: the model's call, its arguments, its outcome.
    calls = first.locator(".calls .call")
    assert calls.count() == 1
    assert calls.locator(".name").inner_text() == "exec_command"
    assert calls.locator(".outcome").inner_text() == "valid"
    assert json.loads(calls.locator("pre.args").inner_text()) == {"cmd": "echo looptrace-ok"}
    assert "result, in step 2" in calls.inner_text()
    # Step 2: the tool's result, beside the call it answers.
    result = second.locator(".msg.tool-result")
    assert result.count() == 1
    assert "for exec_command (step 1)" in result.inner_text() and "looptrace-ok" in result.inner_text()
    assert "The command printed looptrace-ok." in second.inner_text()
    # Every generated token is on the page: as many as the trace holds.
    for i, trace_id in enumerate(s["trace_id"] for s in stored(server, f"/v1/sessions/{session['key']}")["steps"]):
        step = steps.nth(i)
        step.scroll_into_view_if_needed()
        step.locator(".tokens").wait_for()
        expected = stored(server, f"/v1/traces/{trace_id}/tokens")["tokens"]
        assert step.locator(".tokens .tok[data-i]").count() == len(expected) > 0
    assert KEY not in p.url and not any(KEY in url for url in page.requests)


def test_nothing_in_a_trace_becomes_markup(codex_session, page):
    server, _ = codex_session
    # A tool's description and the names in earlier calls are free text and reach the trace; a tool's
    # own name is refused unless it is a name (proxy/api/validation.py: below, after the page is read,
    # so that the refused request's session is not the one the page opens).
    tools = [{"type": "function", "function": {"name": "read_file", "description": HOSTILE,
                                               "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "system", "content": HOSTILE}, {"role": "user", "content": HOSTILE},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_x", "type": "function", "function": {
                    "name": "<svg onload=window.__pwned=7>", "arguments": json.dumps({"<script>k</script>": HOSTILE})}}]},
                {"role": "tool", "tool_call_id": "call_x", "content": HOSTILE},
                {"role": "user", "content": "go on " + HOSTILE}]
    status, answer = api(server, "/v1/chat/completions", {"model": MODEL, "messages": messages, "tools": tools})
    assert status == 200, answer
    bare = wait_until(lambda: next((s for s in stored(server, "/v1/sessions")["data"] if s["conversation"] is None),
                                   None), 15)
    p = page.page
    response = p.goto(server.url + f"/sessions/{bare['key']}")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    enter_key(p)
    step = p.locator("li.step").first
    step.wait_for()
    step.locator(".tokens").wait_for()
    step.get_by_role("button", name="Exact prompt").click()
    p.locator(".prompt-view .prompt").wait_for()
    text = p.locator("#detail").inner_text()
    assert "<img src=x onerror=window.__pwned=1>" in text and "<script>window.__pwned=2</script>" in text
    assert "<script>window.__pwned=4</script>" in text  # the model's own tokens
    assert "⟨U+202E⟩" in text and "⟨U+200B⟩" in text and "⟨U+2066⟩" in text  # hidden characters made visible
    assert p.evaluate("window.__pwned") is None
    assert p.locator("#detail img, #detail svg, #detail script, #detail iframe").count() == 0
    assert p.evaluate("[...document.querySelectorAll('a')].filter(a => /^\\s*javascript:/i.test(a.getAttribute('href'))).length") == 0
    assert p.locator("#detail b").count() == 0
    tools[0]["function"]["name"] = "<img src=q onerror=window.__pwned=6>"
    status, answer = api(server, "/v1/chat/completions", {"model": MODEL, "messages": messages, "tools": tools})
    assert status == 400 and answer["error"]["param"] == "tools[0].function.name", answer


def test_the_key_is_needed_and_never_put_in_a_url(codex_session, page):
    server, session = codex_session
    assert api(server, "/v1/sessions", key=None)[0] == 401
    assert api(server, f"/v1/sessions/{session['key']}", key="wrong")[0] == 401
    with urllib.request.urlopen(server.url + "/", timeout=10) as response:  # the page itself holds no data
        assert response.status == 200
    p = page.page
    p.goto(server.url + f"/sessions/{session['key']}")
    enter_key(p, "wrong")
    p.wait_for_selector("#key-error:not([hidden])")
    assert "refused" in p.inner_text("#key-error")
    p.fill("#key-input", KEY)
    p.click("#key-form button[type=submit]")
    p.locator("li.step").first.wait_for()
    # The key went to the login alone: the page holds an HttpOnly session cookie, no storage holds the key.
    assert p.evaluate("JSON.stringify([{...sessionStorage}, {...localStorage}, document.cookie])") == '[{},{},""]'
    assert [c["httpOnly"] for c in page.context.cookies()] == [True]
    assert not any(KEY in url or "wrong" in url for url in page.requests)


# -- the local backend: probabilities, alternatives, forks, live steps -------------------------------

@pytest.fixture(scope="module")
def local(serve, qwen3_5_dir):
    server = serve(str(qwen3_5_dir), "--served-model-name", "tiny-qwen", api_key=KEY)
    model = AutoModelForCausalLM.from_pretrained(qwen3_5_dir, dtype=torch.float32).eval()
    return server, model


def ask(server, conversation: str, text: str, max_tokens: int = 24) -> dict:
    request = urllib.request.Request(server.url + "/v1/chat/completions", method="POST", data=json.dumps({
        "model": "tiny-qwen", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
        "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}", "session_id": conversation})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def open_session(page, server, conversation: str):
    p = page.page
    p.goto(server.url + f"/sessions/{conversation}")
    enter_key(p)
    p.locator("li.step .tokens").first.wait_for()
    return p


def test_hovering_a_token_shows_its_five_alternatives(local, page):
    server, _ = local
    ask(server, "hover", "Name a colour.")
    trace_id = stored(server, "/v1/sessions/hover")["steps"][0]["trace_id"]
    tokens = stored(server, f"/v1/traces/{trace_id}/tokens")["tokens"]
    p = open_session(page, server, "hover")
    token = p.locator("li.step .tokens .tok[data-i='2']")
    token.hover()
    tip = p.locator("#tip")
    tip.wait_for(state="visible")
    alternatives = tip.locator("ol.alts li")
    assert alternatives.count() == 5
    ids = [int(alternatives.nth(k).locator(".alt-id").inner_text().lstrip("#")) for k in range(5)]
    assert ids == tokens[2]["top_ids"]
    assert f"id {tokens[2]['id']}" in tip.inner_text()
    # And from the keyboard: focus the tokens, move right, the tip follows.
    p.locator("li.step .tokens").first.focus()
    p.keyboard.press("ArrowRight")
    assert f"id {tokens[1]['id']}" in tip.inner_text()


def test_a_tokens_tooltip_shows_the_text_it_adds_with_its_piece_beside(serve, qwen3_5_dir, tmp_path, page):
    # The vocabulary's pieces are byte-level (Ċ a newline, Ġ a space): the tooltip shows a person the
    # text a token adds, whitespace made visible, and the raw piece and id beside it; text as text.
    answer = "First line.\n\n\tThen <b>bold</b> words.<|im_end|>"
    replay = tmp_path / "steps.jsonl"
    replay.write_text(json.dumps({"text": answer}) + "\n")
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(replay), "--served-model-name", "tiny-qwen",
                   api_key=KEY)
    ask(server, "tooltip", "Say two lines.")
    trace_id = stored(server, "/v1/sessions/tooltip")["steps"][0]["trace_id"]
    tokens = stored(server, f"/v1/traces/{trace_id}/tokens")["tokens"]
    newline = next(i for i, t in enumerate(tokens) if "\n" in t["text"])
    assert "Ċ" in tokens[newline]["piece"]  # what the tooltip showed before
    tab = next(i for i, t in enumerate(tokens) if "\t" in t["text"])
    space = next(i for i, t in enumerate(tokens) if t["text"].startswith(" ") and t["text"].strip())
    markup = next(i for i, t in enumerate(tokens) if "<" in t["text"])
    p = open_session(page, server, "tooltip")
    shown = p.locator("li.step .tokens").first
    tip = p.locator("#tip")

    def hover(i: int) -> tuple[str, str]:
        shown.locator(f".tok[data-i='{i}']").hover()
        tip.locator(".tip-raw", has_text=re.compile(rf"id {tokens[i]['id']}$")).wait_for(timeout=10_000)
        return tip.locator(".tip-text").inner_text(), tip.locator(".tip-raw").inner_text()

    text, raw = hover(newline)
    assert text == tokens[newline]["text"].replace("\n", "⏎").replace("\t", "→").replace(" ", "·")
    assert "⏎" in text and "Ċ" not in text
    assert raw == f"{tokens[newline]['piece']} · id {tokens[newline]['id']}"  # the raw piece and id, beside
    assert "→" in hover(tab)[0] and hover(space)[0].startswith("·")
    assert "<" in hover(markup)[0] and tip.locator("b").count() == 0  # text, never markup
    if os.environ.get("LOOPTRACE_SCREENSHOTS"):
        hover(newline)
        p.screenshot(path=os.path.join(os.environ["LOOPTRACE_SCREENSHOTS"], "tooltip.png"))


def test_a_fork_from_the_page_continues_as_the_model_would(local, page):
    server, model = local
    ask(server, "fork", "Count to five.")
    trace_id = stored(server, "/v1/sessions/fork")["steps"][0]["trace_id"]
    tokens = stored(server, f"/v1/traces/{trace_id}/tokens")["tokens"]
    trace = stored(server, f"/v1/traces/{trace_id}")
    prompt = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]["looptrace.prompt.ids"]
    p = open_session(page, server, "fork")
    index = 4
    p.locator(f"li.step .tokens .tok[data-i='{index}']").click()
    panel = p.locator(".fork")
    panel.wait_for()
    chosen = tokens[index]["top_ids"][1]  # the runner-up
    panel.locator(f"button.alt[data-token-id='{chosen}']").click()
    result = panel.locator(".fork-result .fork-cols")
    result.wait_for(timeout=60_000)
    fork_trace = panel.locator(".fork-result").get_attribute("data-fork-trace")
    forked = stored(server, f"/v1/traces/{fork_trace}/tokens")["tokens"]
    # The page shows the replacement, then the continuation, beside the original.
    shown = result.locator(".fork-col").nth(1).locator(".tokens")
    assert shown.locator(".tok.forced").count() == 1
    assert shown.locator(".tok[data-i]").count() == len(forked)
    # What a direct, greedy run from the same prefix gives.
    prefix = prompt + [t["id"] for t in tokens[:index]] + [chosen]
    stop = [248046, 248044]  # <|im_end|>, <|endoftext|>
    with torch.inference_mode():
        out = model.generate(torch.tensor([prefix]), attention_mask=torch.ones(1, len(prefix), dtype=torch.long),
                             max_new_tokens=len(forked), do_sample=False, eos_token_id=stop, pad_token_id=0)
    assert [t["id"] for t in forked] == out[0, len(prefix):].tolist()
    assert len(forked) >= 4


def test_a_new_step_appears_without_a_reload(local, page):
    server, _ = local
    ask(server, "live", "First step.")
    p = open_session(page, server, "live")
    assert p.locator("li.step").count() == 1
    p.wait_for_selector("#live[data-state=on]")
    p.evaluate("window.__sameDocument = true")
    ask(server, "live", "Second step.")
    answered = time.monotonic()
    p.locator("li.step").nth(1).wait_for(timeout=10_000)
    appeared = time.monotonic() - answered
    assert p.evaluate("window.__sameDocument") is True  # the page was not reloaded
    assert p.locator("li.step").count() == 2
    print(f"the new step appeared {appeared:.2f} s after the answer")


def test_without_content_the_page_shows_numbers_not_words(serve, qwen3_5_dir, page):
    server = serve(str(qwen3_5_dir), "--served-model-name", "tiny-qwen", "--no-trace-content", api_key=KEY)
    ask(server, "bare", "A secret question.")
    p = open_session(page, server, "bare")
    step = p.locator("li.step").first
    assert "A secret question." not in p.inner_text("#detail")
    assert "not recorded" in step.inner_text()
    tokens = step.locator(".tokens .tok[data-i]")
    assert tokens.count() == 24 and tokens.first.inner_text() == "▪"
    tokens.first.hover()
    tip = p.locator("#tip")
    tip.wait_for(state="visible")
    assert "%" in tip.inner_text()  # probabilities stay


def test_a_trace_that_lost_spans_is_shown_as_incomplete(local, page):
    # Spans are lost only when the store's queue is full or a write fails (test_trace_store.py makes
    # both happen); here the store is told so directly, as its writer would record it.
    server, _ = local
    ask(server, "lossy", "A step that lost spans.")
    (step,) = wait_until(lambda: stored(server, "/v1/sessions/lossy", timeout=15)["steps"] or None, 15)
    orphan = "ab" * 16  # a trace whose server span never arrived
    with sqlite3.connect(server.trace_db, timeout=10) as db:
        db.executemany("INSERT INTO lost_spans VALUES (?, ?, ?)",
                       [(step["trace_id"], 3, time.time_ns()), (orphan, 2, time.time_ns())])
    p = open_session(page, server, "lossy")
    note = p.locator("li.step .lost")
    assert note.count() == 1 and note.inner_text().startswith("Incomplete: 3 spans of this step never reached the store")
    p.goto(server.url + f"/traces/{orphan}")
    p.locator("#detail .error").wait_for()
    assert "This trace is incomplete: 2 of its spans never reached the store" in p.inner_text("#detail")


def test_an_attached_image_is_shown_with_the_prompt_it_became(serve, qwen3_5_dir, tmp_path, page):
    # The image itself stays out of the trace; its thumbnail (the server's own small JPEG), size and
    # tokens are shown above the exact prompt, and the message that carried it names it.
    import base64
    import io

    from PIL import Image

    from tiny_media import mp4, with_images

    replay = tmp_path / "steps.jsonl"
    replay.write_text(json.dumps({"text": "A red square.<|im_end|>"}) + "\n")
    server = serve(str(with_images(qwen3_5_dir, "qwen3_5")), "--backend", "replay", "--replay", str(replay),
                   "--served-model-name", MODEL, api_key=KEY)
    picture = io.BytesIO()
    Image.new("RGB", (64, 48), (220, 30, 30)).save(picture, "PNG")
    url = "data:image/png;base64," + base64.b64encode(picture.getvalue()).decode()
    status, answer = api(server, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}},
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(mp4()).decode()}}]}]})
    assert status == 200, answer
    session = wait_until(lambda: next(iter(stored(server, "/v1/sessions")["data"]), None), 15)
    p = page.page
    p.goto(server.url + f"/sessions/{session['key']}")
    enter_key(p)
    step = p.locator("li.step").first
    step.wait_for()
    assert "[image image/png]" in step.inner_text() and "[video video/mp4]" in step.inner_text()
    step.get_by_role("button", name="Exact prompt").click()
    p.locator(".media-strip img").first.wait_for()
    assert p.evaluate("[...document.querySelectorAll('.media-strip img')].map(i => i.naturalWidth)") == [64, 64]
    image, video = p.locator(".media-strip figcaption").all_inner_texts()
    assert image.startswith("image · 64×48 · PNG") and "tokens from token" in image, image
    assert video.startswith("video · 64×48 · 8 of 40 frames, 4 s · h264") and "tokens from token" in video, video
    p.screenshot(path=str(tmp_path / "media.png"))
    if os.environ.get("LOOPTRACE_SCREENSHOTS"):
        p.screenshot(path=os.path.join(os.environ["LOOPTRACE_SCREENSHOTS"], "media.png"))


def test_drafted_tokens_are_marked_and_say_whether_the_draft_stood(serve, qwen3_5_dir, tmp_path, page):
    # Speculative decoding with a draft model: the tiny Qwen3.5 drafting for itself with its weights
    # nudged, so some drafts stand and some are rejected; the page marks both and says which.
    from transformers import AutoTokenizer

    drafter = AutoModelForCausalLM.from_pretrained(qwen3_5_dir, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for weight in drafter.parameters():
            if weight.dim() > 1:
                weight.add_(torch.randn(weight.shape, generator=generator) * weight.std() * 0.01)
    drafter.save_pretrained(tmp_path / "drafter")
    AutoTokenizer.from_pretrained(qwen3_5_dir).save_pretrained(tmp_path / "drafter")
    config = json.dumps({"method": "draft_model", "model": str(tmp_path / "drafter"), "num_speculative_tokens": 4})
    server = serve(str(qwen3_5_dir), "--served-model-name", "tiny-qwen", "--speculative-config", config, api_key=KEY)
    ask(server, "drafts", "Name a colour.", max_tokens=48)
    trace_id = stored(server, "/v1/sessions/drafts")["steps"][0]["trace_id"]
    tokens = stored(server, f"/v1/traces/{trace_id}/tokens")["tokens"]
    stood = [i for i, t in enumerate(tokens) if t["drafted"] and t["accepted"]]
    rejected = [i for i, t in enumerate(tokens) if t["drafted"] and not t["accepted"]]
    assert stood and rejected
    p = open_session(page, server, "drafts")
    shown = p.locator("li.step .tokens").first
    assert shown.locator(".tok.drafted-accepted[data-i]").count() == len(stood)
    assert shown.locator(".tok.drafted[data-i]").count() == len(rejected)
    assert f"drafts {len(stood)}/" in p.locator("li.step").first.inner_text()
    assert "accepted (draft_model)" in p.locator("li.step").first.inner_text()  # the step's method
    tip = p.locator("#tip")
    shown.locator(f".tok[data-i='{rejected[0]}']").hover()
    tip.wait_for()
    assert "the draft was rejected: this is the model's own token" in tip.inner_text()
    assert "drafted by" in tip.inner_text() and "a draft model" in tip.inner_text()  # the method, per token
    assert {tokens[i]["draft_method"] for i in stood + rejected} == {"draft_model"}
    shown.locator(f".tok[data-i='{stood[0]}']").hover()
    p.wait_for_function("document.getElementById('tip').innerText.includes('yes: the draft stood')")
    assert f"{stood[0]} of the answer" in tip.inner_text() and f"id {tokens[stood[0]]['id']}" in tip.inner_text()
    p.screenshot(path=str(tmp_path / "drafts.png"))
    if os.environ.get("LOOPTRACE_SCREENSHOTS"):
        p.screenshot(path=os.path.join(os.environ["LOOPTRACE_SCREENSHOTS"], "drafts.png"))


# -- a session of hundreds of steps ---------------------------------------------------------------------

LONG_STEPS = 260


@pytest.fixture(scope="module")
def long_session(serve, qwen3_5_dir, tmp_path_factory):
    """A session of LONG_STEPS tool-calling steps (a file read each), stored whole."""
    tmp = tmp_path_factory.mktemp("long-viewer")
    replay = tmp / "steps.jsonl"
    replay.write_text("".join(json.dumps({"text": call("read_file", path=f"src/m{n}.py") + "<|im_end|>"}) + "\n"
                              for n in range(LONG_STEPS)))
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(replay), "--served-model-name", MODEL)
    tool = {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
    messages = [{"role": "user", "content": "Read every module."}]
    for n in range(LONG_STEPS):
        status, answer = server.post("/v1/chat/completions", {"model": MODEL, "messages": messages[:1] + messages[1:][-4:],
                                                              "tools": [tool]}, headers={"session_id": "long"})
        assert status == 200, answer
        called = answer["choices"][0]["message"]
        messages += [called, {"role": "tool", "tool_call_id": called["tool_calls"][0]["id"], "content": f"# m{n}\n"}]
    def all_stored():
        session = api(server, "/v1/sessions/long", key=None)[1]
        return session and session.get("steps_total") == LONG_STEPS and [step["trace_id"] for step in session["steps"]]
    traces = wait_until(all_stored, 15, what=f"the session's {LONG_STEPS} steps stored")
    return server, traces


def test_a_long_session_shows_its_first_steps_at_once_and_the_rest_as_it_scrolls(long_session, page):
    server, traces = long_session
    p = page.page
    p.goto(server.url + "/sessions/long")
    p.locator("li.step").first.wait_for()
    assert p.locator("li.step").count() == 50  # the first page, drawn at once
    assert p.locator("li.step").first.get_attribute("data-step") == traces[0]
    assert f"{LONG_STEPS - 50} more steps" in p.inner_text(".more-steps")
    for _ in range(20):  # scrolling to the end draws the next pages
        p.locator(".more-steps").scroll_into_view_if_needed()
        if p.locator("li.step").count() == LONG_STEPS:
            break
        p.wait_for_timeout(200)
    assert [p.locator("li.step").nth(i).get_attribute("data-step") for i in (0, 49, 50, LONG_STEPS - 1)] == \
        [traces[0], traces[49], traces[50], traces[-1]]
    assert p.inner_text(".more-steps") == "" and "Step 260" in p.locator("li.step").last.inner_text()


def test_a_link_to_a_late_step_of_a_long_session_loads_its_page(long_session, page):
    server, traces = long_session
    p = page.page
    p.goto(server.url + f"/traces/{traces[230]}")
    focused = p.locator(f"li.step[data-step='{traces[230]}']")
    focused.wait_for(timeout=15_000)
    assert "Step 231" in focused.inner_text() and p.locator("li.step").count() >= 231
