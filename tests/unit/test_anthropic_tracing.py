"""/v1/messages traced like the other APIs, on a real (tiny) model decoding here: every token kept for
the heat map, the prompt view and its diff against the step before, a fork from any token; and on
Gemma 4, a tool loop renders as its Chat Completions twin (Gemma's template names a tool's response
from the call it answers)."""

from __future__ import annotations

import json

import pytest

from looptrace.proxy.settings import Settings

from app_thread import AppThread
from messages_api import BASH, Capture, frames, post_messages

SESSION = "claude-session-1"
HEADERS = {"X-Claude-Code-Session-Id": SESSION, "User-Agent": "claude-cli/2.1.332 (external, sdk-cli)"}


def steps_of(app, count: int) -> list[dict]:
    return app.stored(f"/v1/sessions/{SESSION}", steps=count)["steps"]


def test_a_messages_session_has_tokens_prompt_diffs_and_forks(local_app):
    ask = [{"role": "user", "content": "Name three colours."}]
    body = {"model": "tiny-qwen", "max_tokens": 8, "temperature": 0, "thinking": {"type": "disabled"}, "stream": True}
    status, data = post_messages(local_app, {**body, "messages": ask}, HEADERS)
    assert status == 200, data
    said = "".join(e["delta"].get("text", "") for kind, e in frames(data) if kind == "content_block_delta")
    follow = ask + [{"role": "assistant", "content": said}, {"role": "user", "content": "And three more."}]
    assert post_messages(local_app, {**body, "messages": follow}, HEADERS)[0] == 200
    first, second = steps_of(local_app, 2)[:2]
    # Sent again, the prompt is read from the local backend's prefix cache, and message_start says so,
    # its parts adding up to the prompt.
    status, data = post_messages(local_app, {**body, "messages": follow}, HEADERS)
    usage = frames(data)[0][1]["message"]["usage"]
    assert usage["cache_read_input_tokens"] > 0
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == second["input_tokens"]

    tokens = local_app.stored(f"/v1/traces/{second['trace_id']}/tokens")["tokens"]
    assert len(tokens) == second["output_tokens"] == 8  # every token, with what the heat map shows
    assert all(0 < t["p"] <= 1 and len(t["top_ids"]) == 5 for t in tokens)

    prompt = local_app.stored(f"/v1/traces/{second['trace_id']}/prompt?against={first['trace_id']}")
    text = "".join(piece for _, piece, _ in prompt["tokens"])
    assert "And three more." in text[len("".join(p for _, p, _ in prompt["tokens"][:prompt["new_offset"]])):]

    status, fork = local_app.call("POST", f"/v1/traces/{second['trace_id']}/fork",
                                  {"index": 2, "token_id": tokens[2]["top_ids"][1]})
    assert status == 200, fork
    assert fork["looptrace"]["forked_from"] == {"trace_id": second["trace_id"], "index": 2}


@pytest.fixture(scope="module")
def gemma(gemma4_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma")
    (folder / "steps.jsonl").write_text('{"text": "unused"}\n')
    app = AppThread(Settings(model=str(gemma4_dir), backend="replay", replay=str(folder / "steps.jsonl"),
                             served_model_name="tiny-gemma", trace_db=str(folder / "t.sqlite3"))).start()
    app.runtime.backend = Capture(app.runtime.vocab, "Ok.<turn|>")
    yield app
    app.stop()


def test_a_gemma_tool_loop_renders_as_its_chat_completions_twin(gemma):
    anthropic = {"model": "tiny-gemma", "max_tokens": 4, "system": "Be brief.", "tools": [BASH],
                 "thinking": {"type": "enabled", "budget_tokens": 2}, "messages": [
                     {"role": "user", "content": "List the files."},
                     {"role": "assistant", "content": [
                         {"type": "thinking", "thinking": "ls will do.", "signature": "x"},
                         {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                   "content": [{"type": "text", "text": "a.txt"}]}]}]}
    chat = {"model": "tiny-gemma", "max_tokens": 4, "chat_template_kwargs": {"enable_thinking": True},
            "tools": [{"type": "function", "function": {"name": "Bash", "description": BASH["description"],
                                                        "parameters": BASH["input_schema"]}}],
            "messages": [
                {"role": "system", "content": "Be brief."}, {"role": "user", "content": "List the files."},
                {"role": "assistant", "content": "", "reasoning_content": "ls will do.", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "Bash",
                                                                       "arguments": json.dumps({"command": "ls"})}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"}]}
    prompts = []
    for path, body in (("/v1/messages", anthropic), ("/v1/chat/completions", chat)):
        status, data = post_messages(gemma, body, path=path)
        assert status == 200, data
        prompts.append(gemma.runtime.tokenizer.decode(gemma.runtime.backend.prompts.pop()))
    assert prompts[0] == prompts[1]
    assert "response:Bash{" in prompts[0]
