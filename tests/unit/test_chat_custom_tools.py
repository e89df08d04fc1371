"""OpenAI's custom (free-form) tools in Chat Completions, and assistant content as parts: the model
is shown a function of one string, its call comes back as OpenAI's custom call (checked against the
openai SDK's own types), a past custom call and a refusal part render as the model would have written
them, and a malformed one is the API's 400."""

from __future__ import annotations

import json

from openai.types.chat import ChatCompletion, ChatCompletionMessageCustomToolCall

from messages_api import Capture, qwen_call
from server import sse_events

MODEL = "tiny-qwen"
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch"
GRAMMAR = 'start: "*** Begin Patch" LF'
APPLY_PATCH = {"type": "custom", "custom": {"name": "apply_patch", "description": "Edit files.",
                                            "format": {"type": "grammar",
                                                       "grammar": {"syntax": "lark", "definition": GRAMMAR}}}}
SHELL = {"type": "function", "function": {"name": "shell", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def ask(app, **body):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Add a.txt"}], "tools": [APPLY_PATCH, SHELL],
            **NO_THINKING, **body}
    return app.call("POST", "/v1/chat/completions", body)


def test_a_custom_tool_call_comes_back_as_openais_custom_call(replay_app):
    replay_app.replay(qwen_call("apply_patch", input=PATCH) + "<|im_end|>")
    status, body = ask(replay_app)
    assert status == 200, body
    answer = ChatCompletion.model_validate(body)
    (call,) = answer.choices[0].message.tool_calls
    assert isinstance(call, ChatCompletionMessageCustomToolCall)
    assert (call.custom.name, call.custom.input) == ("apply_patch", PATCH) and call.id.startswith("call_")
    assert answer.choices[0].finish_reason == "tool_calls"


def test_a_streamed_custom_call_carries_its_input_whole(replay_app):
    replay_app.replay(qwen_call("apply_patch", input=PATCH) + "<|im_end|>")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Add a.txt"}], "tools": [APPLY_PATCH],
            "stream": True, **NO_THINKING}
    status, _, data = replay_app.post(body, path="/v1/chat/completions")
    assert status == 200
    calls = [c for e in sse_events(data) if isinstance(e, dict) and e.get("choices")
             for c in e["choices"][0]["delta"].get("tool_calls") or ()]
    assert [(c["type"], c["custom"]) for c in calls] == [("custom", {"name": "apply_patch", "input": PATCH})]


def test_a_function_call_beside_a_custom_tool_stays_a_function_call(replay_app):
    replay_app.replay(qwen_call("shell", command="ls") + "<|im_end|>")
    status, body = ask(replay_app)
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert (call["type"], call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "function", "shell", {"command": "ls"})


def test_the_model_is_shown_one_string_with_the_grammar_and_a_past_call_as_it_wrote_it(replay_app):
    capture = replay_app.runtime.backend = Capture(replay_app.runtime.vocab)
    history = [{"role": "user", "content": "Add a.txt"},
               {"role": "assistant", "content": [{"type": "refusal", "refusal": "Not that file."},
                                                 {"type": "text", "text": "This one instead."}],
                "refusal": None, "tool_calls": [{"id": "call_1", "type": "custom",
                                                 "custom": {"name": "apply_patch", "input": PATCH}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "Done: a.txt"}]
    status, body = ask(replay_app, messages=history)
    assert status == 200, body
    prompt = replay_app.runtime.tokenizer.decode(capture.prompts[-1])
    tools = prompt[prompt.index("<tools>"):prompt.index("</tools>")]
    offered = [json.loads(line)["function"] for line in tools.splitlines()[1:] if line.startswith("{")]
    patch = next(t for t in offered if t["name"] == "apply_patch")
    assert patch["parameters"]["required"] == ["input"] and GRAMMAR in patch["parameters"]["properties"]["input"][
        "description"]
    assert "Not that file.\nThis one instead." in prompt  # the parts joined as vLLM joins them
    assert qwen_call("apply_patch", input=PATCH) in prompt and "Done: a.txt" in prompt


def test_a_malformed_custom_tool_or_call_is_the_apis_400(replay_app):
    for body, param in (
        ({"tools": [{"type": "custom", "custom": {"description": "no name"}}]}, "tools[0].custom.name"),
        ({"tools": [{"type": "custom", "custom": {"name": "bad<|im_end|>"}}]}, "tools[0].custom.name"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"type": "custom", "custom": {"name": "x"}}]}]},
         "messages[0].tool_calls[0].custom.input"),
        ({"messages": [{"role": "assistant", "content": [{"type": "refusal"}]}]}, "messages[0].content[0].refusal"),
    ):
        status, answer = ask(replay_app, **body)
        assert (status, answer["error"]["type"], answer["error"]["param"]) == (400, "invalid_request_error", param), \
            answer
