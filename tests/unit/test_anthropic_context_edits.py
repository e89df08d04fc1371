"""Claude Code's 2026 wire on /v1/messages, against the real application (the replay backend serving
the tiny Qwen3.5 with its real tokenizer and template): `context_management.edits` change what the
model reads (old tool results and inputs cleared, old thinking dropped) and are answered back as
Anthropic answers them; `thinking.display: "omitted"` is taken (thinking still answered whole);
the full 2026 beta header, `output_config.effort`, an unknown edit and a mid-conversation system
message are taken, never refused.
"""

from __future__ import annotations

import json

import pytest
from anthropic.types.beta import BetaMessage, BetaRawMessageDeltaEvent

from looptrace.proxy.api.anthropic.context_edits import PLACEHOLDER

from messages_api import BASH, Capture, frames, post_messages, qwen_call

MODEL = "tiny-qwen"
# What Claude Code 2.1.33x sends, 2026: about ten betas, some newer than this server.
BETAS = ("claude-code-20250219,context-management-2025-06-27,interleaved-thinking-2025-05-14,"
         "mid-conversation-system-2026-04-07,advanced-tool-use-2025-11-20,effort-2025-11-24,"
         "mid-conversation-tool-changes-2026-07-01,fine-grained-tool-streaming-2025-05-14,"
         "prompt-caching-scope-2026-01-05,some-beta-from-the-future-2027-01-01")
HEADERS = {"User-Agent": "claude-cli/2.1.337 (external, sdk-cli)", "anthropic-version": "2023-06-01",
           "anthropic-beta": BETAS}


def call(n: int, command: str) -> dict:
    return {"role": "assistant", "content": [
        {"type": "thinking", "thinking": f"Thought number {n}.", "signature": "theirs"},
        {"type": "tool_use", "id": f"toolu_{n}", "name": "Bash", "input": {"command": command}}]}


def result(n: int, text: str) -> dict:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": text}]}


# Three calls in one agent turn, each result a marker, then a mid-conversation system message.
LOOP = [{"role": "user", "content": "Look around."},
        call(1, "ls"), result(1, "OUTPUT-ONE"),
        call(2, "cat a.txt"), result(2, "OUTPUT-TWO"),
        call(3, "cat b.txt"), result(3, "OUTPUT-THREE"),
        {"role": "system", "content": "The sandbox is read-only now."}]


@pytest.fixture
def capture(replay_app):
    before = replay_app.runtime.backend
    replay_app.runtime.backend = Capture(replay_app.runtime.vocab)
    yield replay_app.runtime.backend
    replay_app.runtime.backend = before


def ask(replay_app, *edits, path="/v1/messages", **body) -> tuple[int, dict | bytes]:
    request = {"model": MODEL, "max_tokens": 64, "messages": LOOP, "tools": [BASH],
               "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}, **body}
    if edits:
        request["context_management"] = {"edits": list(edits)}
    status, data = post_messages(replay_app, request, headers=HEADERS, path=path)
    return status, (data if body.get("stream") else json.loads(data))


def prompt(replay_app, capture) -> str:
    return replay_app.runtime.tokenizer.decode(capture.prompts.pop())


def test_nothing_asked_nothing_edited_and_the_2026_wire_is_taken(replay_app, capture):
    status, answer = ask(replay_app)
    assert status == 200, answer
    assert "context_management" not in answer
    text = prompt(replay_app, capture)
    assert all(marker in text for marker in ("OUTPUT-ONE", "OUTPUT-TWO", "OUTPUT-THREE"))
    assert "The sandbox is read-only now." in text and PLACEHOLDER not in text  # the system message renders


def test_clear_tool_uses_keeps_the_latest_and_says_what_it_cleared(replay_app, capture):
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2},
            "keep": {"type": "tool_uses", "value": 1}}
    status, answer = ask(replay_app, edit)
    assert status == 200, answer
    text = prompt(replay_app, capture)
    assert "OUTPUT-ONE" not in text and "OUTPUT-TWO" not in text and "OUTPUT-THREE" in text
    assert text.count(PLACEHOLDER) == 2
    assert "cat a.txt" in text  # the calls' inputs stay unless asked
    (applied,) = answer["context_management"]["applied_edits"]
    assert applied["type"] == "clear_tool_uses_20250919" and applied["cleared_tool_uses"] == 2
    (typed,) = BetaMessage.model_validate(answer).context_management.applied_edits  # the SDK's own types
    assert (typed.type, typed.cleared_tool_uses) == ("clear_tool_uses_20250919", 2)
    tok = replay_app.runtime.tokenizer
    assert applied["cleared_input_tokens"] == sum(len(tok.encode(t, add_special_tokens=False))
                                                  for t in ("OUTPUT-ONE", "OUTPUT-TWO"))


def test_clear_tool_uses_inputs_exclusions_and_its_least(replay_app, capture):
    base = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 0},
            "keep": {"type": "tool_uses", "value": 0}}
    ask(replay_app, {**base, "clear_tool_inputs": True})
    text = prompt(replay_app, capture)
    assert "cat a.txt" not in text and "OUTPUT-THREE" not in text and text.count(PLACEHOLDER) == 3
    ask(replay_app, {**base, "exclude_tools": ["Bash"]})
    assert "OUTPUT-ONE" in prompt(replay_app, capture)
    status, answer = ask(replay_app, {**base, "clear_at_least": {"type": "input_tokens", "value": 100_000}})
    assert "OUTPUT-ONE" in prompt(replay_app, capture)  # clearing would free too little: nothing is
    assert answer["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 0


@pytest.mark.parametrize(("trigger", "cleared"), [(10, True), (10**9, False), (None, False)])
def test_an_input_token_trigger_reads_the_prompts_length(replay_app, capture, trigger, cleared):
    edit = {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 1}}
    if trigger is not None:
        edit["trigger"] = {"type": "input_tokens", "value": trigger}  # absent: 100,000, far past this prompt
    status, answer = ask(replay_app, edit)
    assert status == 200, answer
    text = prompt(replay_app, capture)
    assert ("OUTPUT-ONE" not in text) is cleared and capture.prompts == []  # the count itself ran nothing
    assert (answer["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 2) is cleared


def test_clear_thinking_and_count_tokens_count_the_edited_prompt(replay_app, capture):
    # In its own tool loop Qwen3.5 renders every earlier thought: the edit keeps the latest one.
    status, answer = ask(replay_app, {"type": "clear_thinking_20251015"})
    assert status == 200, answer
    text = prompt(replay_app, capture)
    assert "Thought number 1." not in text and "Thought number 2." not in text and "Thought number 3." in text
    (applied,) = answer["context_management"]["applied_edits"]
    assert applied["type"] == "clear_thinking_20251015" and applied["cleared_thinking_turns"] == 2
    ask(replay_app, {"type": "clear_thinking_20251015", "keep": "all"})
    assert "Thought number 1." in prompt(replay_app, capture)
    body = {"model": MODEL, "messages": LOOP, "tools": [BASH]}
    counts = []
    for edits in ([], [{"type": "clear_thinking_20251015"}]):
        status, data = post_messages(replay_app, {**body, "context_management": {"edits": edits}}, headers=HEADERS,
                                     path="/v1/messages/count_tokens")
        assert status == 200, data
        counts.append(json.loads(data)["input_tokens"])
    assert counts[1] < counts[0]


def test_an_unknown_edit_is_ignored(replay_app, capture):
    status, answer = ask(replay_app, {"type": "clear_everything_20270101", "keep": {"type": "turns", "value": 1}})
    assert status == 200, answer
    assert answer["context_management"] == {"applied_edits": []}
    assert "OUTPUT-ONE" in prompt(replay_app, capture)


def test_edits_are_answered_in_the_streams_message_delta(replay_app, capture):
    status, data = ask(replay_app, {"type": "clear_thinking_20251015"}, stream=True)
    assert status == 200, data
    events = frames(data)
    delta = next(e for kind, e in events if kind == "message_delta")
    assert delta["context_management"]["applied_edits"][0]["cleared_thinking_turns"] == 2
    typed = BetaRawMessageDeltaEvent.model_validate({"type": "message_delta", **delta})
    assert typed.context_management.applied_edits[0].cleared_thinking_turns == 2


@pytest.mark.parametrize("stream", [False, True])
def test_omitted_thinking_is_answered_with_its_text(replay_app, stream):
    """Claude Code sends display "omitted" and sends the blocks back: their text must come back with them,
    since our signature is a digest, not the thought (Anthropic's is the thought, encrypted)."""
    replay_app.replay("A private thought.\n</think>\n\n" + qwen_call("Bash", command="ls") + "<|im_end|>")
    status, data = ask(replay_app, stream=stream, thinking={"type": "adaptive", "display": "omitted"},
                       messages=[{"role": "user", "content": "ls"}])
    assert status == 200, data
    if stream:
        events = frames(data)
        thought = "".join(e["delta"].get("thinking", "") for kind, e in events if kind == "content_block_delta")
        assert thought == "A private thought."
    else:
        thought, used = data["content"]
        assert thought["thinking"] == "A private thought." and thought["signature"]
        assert used["input"] == {"command": "ls"}
