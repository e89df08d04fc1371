"""/v1/messages, Anthropic's Messages API, over HTTP against the real application (the replay backend
serving the tiny Qwen3.5 with its real tokenizer and template): a conversation renders as its Chat
Completions twin does, thinking sent back is the family's earlier reasoning, tools and tool_choice
reach the prompt, the answer's blocks and stop reasons, count_tokens, errors in Anthropic's shape
with its statuses, the API key as x-api-key, and Claude Code's session header grouping a session.
"""

from __future__ import annotations

import json
import re

import pytest

from looptrace.proxy.settings import Settings

from app_thread import AppThread
from messages_api import BASH, Capture, frames, post_messages, qwen_call

MODEL = "tiny-qwen"
CLAUDE_HEADERS = {"User-Agent": "claude-cli/2.1.332 (external, sdk-cli)", "anthropic-version": "2023-06-01",
                  "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"}


@pytest.fixture
def capture(replay_app):
    """Every request answered "Ok.", its prompt ids kept; the replay backend put back after."""
    before = replay_app.runtime.backend
    replay_app.runtime.backend = Capture(replay_app.runtime.vocab)
    yield replay_app.runtime.backend
    replay_app.runtime.backend = before


def prompt_of(replay_app, capture, path: str, body: dict) -> str:
    status, data = post_messages(replay_app, body, path=path)
    assert status == 200, data
    return replay_app.runtime.tokenizer.decode(capture.prompts.pop())


def messages(**body) -> dict:
    return {"model": MODEL, "max_tokens": 64, **body}


# -- what the model reads ----------------------------------------------------------------------------

TOOL_LOOP = [
    {"role": "user", "content": [{"type": "text", "text": "<system-reminder>Be careful.</system-reminder>\n"},
                                 {"type": "text", "text": "List the files."}]},
    {"role": "system", "content": [{"type": "text", "text": "The working directory is /w."}]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "I should run ls.", "signature": "theirs-Eqw3"},
        {"type": "text", "text": "Running it."},
        {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "a.txt\nb.txt", "is_error": False,
         "cache_control": {"type": "ephemeral"}}]},
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_02", "name": "Bash", "input": {"command": "cat a.txt"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_02", "is_error": True,
         "content": [{"type": "text", "text": "cat: a.txt: denied"}]},
        {"type": "text", "text": "Try again."}]},
]
CHAT_TWIN = [
    {"role": "system", "content": "You are Claude Code.\nBe brief."},
    {"role": "user", "content": [{"type": "text", "text": "<system-reminder>Be careful.</system-reminder>\n"},
                                 {"type": "text", "text": "List the files."}]},
    {"role": "system", "content": "The working directory is /w."},
    {"role": "assistant", "content": "Running it.", "reasoning_content": "I should run ls.", "tool_calls": [
        {"id": "toolu_01", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "toolu_01", "content": "a.txt\nb.txt"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "toolu_02", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "cat a.txt"}'}}]},
    {"role": "tool", "tool_call_id": "toolu_02", "content": "cat: a.txt: denied"},
    {"role": "user", "content": "Try again."},
]
CHAT_TOOL = {"type": "function", "function": {"name": "Bash", "description": BASH["description"],
                                              "parameters": BASH["input_schema"]}}


def test_a_tool_loop_renders_as_its_chat_completions_twin(replay_app, capture):
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;"},
              {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Be brief."}]
    anthropic = prompt_of(replay_app, capture, "/v1/messages?beta=true",
                          messages(system=system, messages=TOOL_LOOP, tools=[BASH], thinking={"type": "adaptive"}))
    chat = prompt_of(replay_app, capture, "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 64, "messages": CHAT_TWIN, "tools": [CHAT_TOOL],
        "chat_template_kwargs": {"enable_thinking": True}})
    assert anthropic == chat
    assert "billing" not in anthropic and "theirs-Eqw3" not in anthropic
    # Thinking sent back is rendered where the family renders earlier reasoning: Qwen3.5 keeps it in
    # the turn's own tool loop (above, a later user message ended that turn, and it was dropped).
    assert "I should run ls." not in anthropic
    in_loop = prompt_of(replay_app, capture, "/v1/messages", messages(system=system, messages=TOOL_LOOP[:4],
                                                                      tools=[BASH]))
    assert "<think>\nI should run ls.\n</think>" in in_loop


def test_a_string_system_and_string_contents(replay_app, capture):
    anthropic = prompt_of(replay_app, capture, "/v1/messages", messages(
        system="Be brief.", messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                                      {"role": "user", "content": "Bye"}]))
    chat = prompt_of(replay_app, capture, "/v1/chat/completions", {"model": MODEL, "max_tokens": 64, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]})
    assert anthropic == chat


def test_thinking_on_off_and_the_template_default(replay_app, capture):
    ask = [{"role": "user", "content": "Hi"}]
    on = prompt_of(replay_app, capture, "/v1/messages", messages(messages=ask, thinking={"type": "enabled",
                                                                                        "budget_tokens": 32}))
    off = prompt_of(replay_app, capture, "/v1/messages", messages(messages=ask, thinking={"type": "disabled"}))
    default = prompt_of(replay_app, capture, "/v1/messages", messages(messages=ask))
    assert on.endswith("<think>\n") and off.endswith("<think>\n\n</think>\n\n")
    assert default == on  # Qwen3.5's template thinks unless told not to


def test_deferred_tools_are_offered_once_a_tool_reference_loads_them(replay_app, capture):
    fetch = {"name": "WebFetch", "description": "Fetch a page.", "defer_loading": True,
             "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}}}
    search = {"name": "ToolSearch", "description": "Find tools.",
              "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}
    server_tool = {"type": "web_search_20250305", "name": "web_search"}  # Anthropic runs these: dropped
    ask = [{"role": "user", "content": "Find a fetch tool."}]
    before = prompt_of(replay_app, capture, "/v1/messages", messages(messages=ask, tools=[search, fetch, server_tool]))
    assert "ToolSearch" in before and "WebFetch" not in before and "web_search" not in before
    loaded = ask + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch",
                                           "input": {"query": "select:WebFetch"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "tool_reference", "tool_name": "WebFetch"}]}]}]
    after = prompt_of(replay_app, capture, "/v1/messages", messages(messages=loaded, tools=[search, fetch]))
    assert '"name": "WebFetch"' in after


@pytest.mark.parametrize(("choice", "tail"), [
    ({"type": "any"}, "<tool_call>\n<function="),
    ({"type": "tool", "name": "Bash"}, "<tool_call>\n<function=Bash>\n"),
])
def test_tool_choice_any_and_tool_start_the_answer_inside_a_call(replay_app, capture, choice, tail):
    prompt = prompt_of(replay_app, capture, "/v1/messages", messages(
        messages=[{"role": "user", "content": "ls"}], tools=[BASH], tool_choice=choice,
        thinking={"type": "disabled"}))
    assert prompt.endswith(tail)


def test_tool_choice_none_leaves_the_tools_out(replay_app, capture):
    prompt = prompt_of(replay_app, capture, "/v1/messages", messages(
        messages=[{"role": "user", "content": "ls"}], tools=[BASH], tool_choice={"type": "none"}))
    assert "Bash" not in prompt


def test_count_tokens_counts_what_the_model_reads(replay_app, capture):
    body = messages(system="Be brief.", messages=TOOL_LOOP, tools=[BASH], thinking={"type": "adaptive"})
    status, data = post_messages(replay_app, {k: v for k, v in body.items() if k != "max_tokens"},
                                 path="/v1/messages/count_tokens")
    assert status == 200, data
    assert json.loads(data) == {"input_tokens": len(prompt_ids(replay_app, capture, body))}


def prompt_ids(replay_app, capture, body) -> list[int]:
    status, data = post_messages(replay_app, body)
    assert status == 200, data
    return capture.prompts.pop()


# -- the answer --------------------------------------------------------------------------------------

def test_a_streamed_answer_in_blocks(replay_app):
    replay_app.replay("Let me look.\n</think>\n\nHere goes.\n\n" + qwen_call("Bash", command="ls") + "<|im_end|>")
    status, data = post_messages(replay_app, messages(messages=[{"role": "user", "content": "ls"}], tools=[BASH],
                                                      stream=True), headers=CLAUDE_HEADERS)
    assert status == 200, data
    events = frames(data)
    kinds = [kind for kind, _ in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    starts = [e["content_block"] for kind, e in events if kind == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"]
    assert starts[2]["name"] == "Bash" and starts[2]["input"] == {}
    by_index = {}
    for kind, event in events:
        if kind == "content_block_delta":
            by_index.setdefault(event["index"], []).append(event["delta"])
    thinking, text, call = by_index[0], by_index[1], by_index[2]
    assert "".join(d["thinking"] for d in thinking[:-1]) == "Let me look."
    assert thinking[-1]["type"] == "signature_delta" and thinking[-1]["signature"]
    assert "".join(d["text"] for d in text).strip() == "Here goes."
    assert [json.loads(d["partial_json"]) for d in call] == [{"command": "ls"}]
    # Each block stops before the next starts, in order.
    order = [(kind, e.get("index")) for kind, e in events if kind.startswith("content_block_") and kind != "content_block_delta"]
    assert order == [("content_block_start", 0), ("content_block_stop", 0), ("content_block_start", 1),
                     ("content_block_stop", 1), ("content_block_start", 2), ("content_block_stop", 2)]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    start_usage = events[0][1]["message"]["usage"]
    assert start_usage["input_tokens"] > 0 and start_usage["output_tokens"] == 0
    assert list(delta["usage"]) == ["output_tokens"] and delta["usage"]["output_tokens"] > 0


@pytest.mark.parametrize(("recorded", "extra", "reason", "sequence", "text"), [
    ("\n</think>\n\nThe answer is 4.<|im_end|>", {}, "end_turn", None, "The answer is 4."),
    ("\n</think>\n\nThe answer is 4. END and more<|im_end|>", {"stop_sequences": ["never", "END"]},
     "stop_sequence", "END", "The answer is 4. "),
    ("\n</think>\n\nCut short by the budget, never finished", {"max_tokens": 4}, "max_tokens", None, None),
])
@pytest.mark.parametrize("stream", [False, True])
def test_stop_reasons(replay_app, recorded, extra, reason, sequence, text, stream):
    replay_app.replay(recorded)
    body = messages(messages=[{"role": "user", "content": "2+2?"}], thinking={"type": "adaptive"}, stream=stream,
                    **extra)
    status, data = post_messages(replay_app, body)
    assert status == 200, data
    if stream:
        events = frames(data)
        got = events[-2][1]["delta"]
        written = "".join(e["delta"].get("text", "") for kind, e in events if kind == "content_block_delta")
    else:
        answer = json.loads(data)
        got = {"stop_reason": answer["stop_reason"], "stop_sequence": answer["stop_sequence"]}
        written = "".join(b.get("text", "") for b in answer["content"])
    assert got == {"stop_reason": reason, "stop_sequence": sequence}
    if text is not None:
        assert written == text


def test_an_answer_not_streamed(replay_app):
    replay_app.replay("Let me look.\n</think>\n\n" + qwen_call("Bash", command="ls") + "<|im_end|>")
    status, data = post_messages(replay_app, messages(messages=[{"role": "user", "content": "ls"}], tools=[BASH]))
    assert status == 200, data
    answer = json.loads(data)
    assert answer["id"].startswith("msg_") and answer["model"] == MODEL and answer["stop_reason"] == "tool_use"
    thought, call = answer["content"]
    assert thought["type"] == "thinking" and thought["thinking"] == "Let me look." and thought["signature"]
    assert (call["type"], call["name"], call["input"]) == ("tool_use", "Bash", {"command": "ls"})


@pytest.mark.parametrize(("recorded", "thought", "answer"), [
    # An unfinished call in the reasoning, the reasoning going on after it (issue 35: a text block came
    # between the two halves of the reasoning) ...
    ("I will look.<tool_call>\n<function=Bash>\nbroken</think>\n\nDone.<|im_end|>",
     "I will look.<tool_call>\n<function=Bash>\nbroken", "Done."),
    # ... and one never closed before the reasoning ended (the close and the answer were text inside it).
    ("I will look.\n<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</tool_call>\n"
     "then answer.\n</think>\n\nDone.<|im_end|>",
     "I will look.\n<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</tool_call>\nthen answer.",
     "Done."),
])
@pytest.mark.parametrize("stream", [False, True])
def test_a_malformed_call_inside_the_reasoning_keeps_the_blocks_in_the_models_order(replay_app, recorded, thought,
                                                                                      answer, stream):
    replay_app.replay(recorded)
    status, data = post_messages(replay_app, messages(messages=[{"role": "user", "content": "ls"}], tools=[BASH],
                                                      thinking={"type": "adaptive"}, stream=stream))
    assert status == 200, data
    if stream:
        events = frames(data)
        blocks = [dict(e["content_block"]) for kind, e in events if kind == "content_block_start"]
        for kind, event in events:
            if kind == "content_block_delta" and event["delta"]["type"] in ("text_delta", "thinking_delta"):
                block = blocks[event["index"]]
                block[block["type"]] += event["delta"][block["type"]]
    else:
        blocks = json.loads(data)["content"]
    assert [(b["type"], b.get("thinking", b.get("text"))) for b in blocks] == [("thinking", thought), ("text", answer)]


# -- refusals, in Anthropic's shape --------------------------------------------------------------------

def error_of(status_and_data) -> tuple[int, str, str]:
    status, data = status_and_data
    body = json.loads(data)
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return status, body["error"]["type"], body["error"]["message"]


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "text/plain", "data": "aGk="}}


@pytest.mark.parametrize(("body", "says"), [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 8, "messages": []}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0].type"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [IMAGE]}]}, "messages[0].content[0].source.media_type"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}]}]}, "PDF"),
    ({"max_tokens": 8, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]}, "temperature"),
    ({"max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 8}, "messages": [
        {"role": "user", "content": "x"}]}, "budget_tokens"),
    ({"max_tokens": 8, "tools": [BASH], "tool_choice": {"type": "tool", "name": "Nope"}, "messages": [
        {"role": "user", "content": "x"}]}, "Nope"),
    ({"max_tokens": 8, "stop_sequences": "END", "messages": [{"role": "user", "content": "x"}]}, "stop_sequences"),
    ({"max_tokens": 10**9, "messages": [{"role": "user", "content": "x"}]}, "max_tokens is too large"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}] * 16_385}, "at most 16,384 are read"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "x"}] * 16_385}]}, "at most 16,384 are read"),
])
def test_bad_requests_are_invalid_request_errors(replay_app, body, says):
    status, kind, message = error_of(post_messages(replay_app, {"model": MODEL, **body}))
    assert (status, kind) == (400, "invalid_request_error") and says in message, message


def test_other_refusals_keep_their_status_and_type(replay_app):
    ask = {"max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    assert error_of(post_messages(replay_app, {"model": "claude-sonnet-4", **ask}))[:2] == (404, "not_found_error")
    assert error_of(post_messages(replay_app, {}, path="/v1/messages/nope"))[:2] == (404, "not_found_error")
    status, data = post_messages(replay_app, {"model": "claude-sonnet-4", **ask}, path="/v1/chat/completions")
    assert status == 404 and "code" in json.loads(data)["error"]  # the OpenAI routes keep OpenAI's shape


@pytest.fixture(scope="module")
def keyed(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("keyed")
    (folder / "steps.jsonl").write_text('{"text": "Ok.<|im_end|>"}\n')
    app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "steps.jsonl"),
                             served_model_name=MODEL, api_key="sk-test", trace_db=str(folder / "t.sqlite3"))).start()
    app.runtime.backend = Capture(app.runtime.vocab)
    yield app
    app.stop()


def test_the_key_as_x_api_key_or_bearer(keyed):
    body = messages(messages=[{"role": "user", "content": "x"}])
    assert post_messages(keyed, body, {"x-api-key": "sk-test"})[0] == 200
    assert post_messages(keyed, body, {"Authorization": "Bearer sk-test"})[0] == 200
    assert error_of(post_messages(keyed, body, {"x-api-key": "sk-wrong"}))[:2] == (401, "authentication_error")
    assert error_of(post_messages(keyed, body))[:2] == (401, "authentication_error")


# -- traced like the other APIs ------------------------------------------------------------------------

def test_claude_codes_session_header_groups_its_requests(replay_app):
    session = "6d549458-d41f-4795-b4f4-de03883c3906"
    headers = {**CLAUDE_HEADERS, "X-Claude-Code-Session-Id": session}
    replay_app.replay("\n</think>\n\n" + qwen_call("Bash", command="ls") + "<|im_end|>", "\n</think>\n\nTwo files.<|im_end|>")
    first = post_messages(replay_app, messages(messages=[{"role": "user", "content": "ls"}], tools=[BASH],
                                               stream=True), headers)
    call = next(e["content_block"] for kind, e in frames(first[1]) if kind == "content_block_start")
    history = [{"role": "user", "content": "ls"}, {"role": "assistant", "content": [call]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "a b"}]}]
    assert post_messages(replay_app, messages(messages=history, tools=[BASH]), headers)[0] == 200
    found = steps_of(replay_app, session, 2)
    assert (found["client"], found["client_version"], found["model"]) == ("claude-cli", "2.1.332", MODEL)
    first_step, second_step = found["steps"]
    assert first_step["endpoint"] == "messages" and first_step["finish_reason"] == "tool_calls"
    assert [t["name"] for t in first_step["tool_calls"]] == ["Bash"]
    assert second_step["new_messages"][-1]["parts"] == [{"type": "tool_call_response", "id": call["id"],
                                                         "response": "a b"}]
    trace = replay_app.stored(f"/v1/traces/{second_step['trace_id']}")
    server = next(s for s in trace["spans"] if s["attributes"].get("looptrace.endpoint") == "messages")
    assert server["name"] == f"messages {MODEL}"
    assert re.search(r'^looptrace_requests_total\{(?=[^}]*endpoint="messages")(?=[^}]*status="200")[^}]*\} [1-9]',
                     metrics_text(replay_app), re.MULTILINE)


def steps_of(app, session: str, count: int) -> dict:
    """The session once its `count` steps are stored (the store writes a moment after each answer)."""
    return app.stored(f"/v1/sessions/{session}", steps=count)


def metrics_text(app) -> str:
    import urllib.request

    with urllib.request.urlopen(app.url + "/metrics", timeout=30) as response:
        return response.read().decode()


# -- images, through the media path the other APIs use ---------------------------------------------------

@pytest.fixture(scope="module")
def seeing(qwen3_5_dir, tmp_path_factory):
    """The tiny Qwen3.5 with its image processor, answering "Ok." (the replay backend reads no images:
    what is checked is what the prompt holds)."""
    from tiny_media import with_images

    folder = tmp_path_factory.mktemp("seeing")
    (folder / "steps.jsonl").write_text('{"text": "Ok.<|im_end|>"}\n')
    app = AppThread(Settings(model=str(with_images(qwen3_5_dir, "qwen3_5")), backend="replay",
                             replay=str(folder / "steps.jsonl"), served_model_name=MODEL,
                             trace_db=str(folder / "t.sqlite3"))).start()
    app.runtime.backend = Capture(app.runtime.vocab)
    yield app
    app.stop()


def png(color=(220, 30, 30)) -> str:
    import base64
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def test_images_in_a_message_and_a_tool_result_reach_the_prompt(seeing):
    import secrets

    image = lambda data: {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}  # noqa: E731
    body = messages(tools=[BASH], messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image(png())]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "x"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "a screenshot:"}, image(png((0, 0, 255)))]}]}])
    trace_id = secrets.token_hex(16)
    status, data = post_messages(seeing, body, {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
    assert status == 200, data
    trace = seeing.stored(f"/v1/traces/{trace_id}", timeout=30)
    render = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]
    items = json.loads(render["looptrace.prompt.media"])
    assert [(i["kind"], i["param"]) for i in items] == [
        ("image", "messages[0].content[1].source.data"), ("image", "messages[2].content[0].content[1].source.data")]
    assert all(i["tokens"] > 0 and i["width"] == 64 for i in items)


@pytest.mark.parametrize(("source", "says"), [
    ({"type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"}, "messages[0].content[0].source.data"),
    ({"type": "url", "url": "https://example.com/cat.png"}, "allowed-media-domains"),
    ({"type": "file", "file_id": "file_01"}, "files API"),
])
def test_an_image_that_cannot_be_read_is_refused_naming_it(seeing, source, says):
    status, kind, message = error_of(post_messages(seeing, messages(messages=[
        {"role": "user", "content": [{"type": "image", "source": source}]}])))
    assert (status, kind) == (400, "invalid_request_error") and says in message, message
