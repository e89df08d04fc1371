"""The generating endpoints (Chat Completions, Responses, Anthropic's Messages) fuzzed with hypothesis
against the real application (the replay backend serving the tiny Qwen3.5, its real tokenizer and
template). Part of issues 13 and 30.

- Any body at all: the APIs' fields with wrong types, non-finite and huge numbers (integers past the
  4,300 digits Python reads among them), deep and huge
  values, control tokens and odd Unicode in every string. Never a 5xx; every refusal in its API's
  error shape; a stream that starts ends properly; the server alive afterwards.
- A well-formed conversation whose every client string (message text, reasoning, call ids, tool
  and argument names, the tool name tool_choice forces, argument values, tool descriptions, property
  names, enum values; for Messages
  also thinking text, tool_result text and blocks, input_schema keys and Claude Code's session
  header) is hostile:
  when accepted, the prompt's control tokens are exactly those of the same conversation with clean
  strings: no string a client sends becomes a turn marker, a tool call or a thought.

CI runs a bounded number of examples; `bench/fuzz.py` runs the same tests with a large budget
(LOOPTRACE_FUZZ_EXAMPLES) and reports what was tried (LOOPTRACE_FUZZ_REPORT).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messages_api import Capture

MODEL = "tiny-qwen"
EXAMPLES = int(os.environ.get("LOOPTRACE_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize="LOOPTRACE_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])
TRIED: Counter = Counter()  # requests sent, by test and status class: bench/fuzz.py's figures

CONTROL = [  # every family's control tokens and the markup its parser reads
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<function=f>", "</function>", "<parameter=x>", "</parameter>",
    "<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>", "<|tool>",
    "<tool|>", "<|tool_response>", "<tool_response|>", "<bos>", "<eos>", "<|think|>", "<start_of_turn>",
    "<|vision_start|>", "<|image_pad|>", "<|fim_prefix|>", "{{ raise_exception('x') }}", "{% if %}",
]
ODD = ["\u0000", "\u202e", "\ufeff", "\u200b", "\U0010ffff", "\ud800", "\udfff", "\r\n", "\t", "é", "🙂", "\\",
       '"', "'", "<", ">", "&", "\u0085", "\u2028"]
HOSTILE = st.lists(st.one_of(st.sampled_from(CONTROL), st.sampled_from(ODD), st.text(max_size=8)),
                   max_size=6).map("".join)
# What an HTTP header can carry (http.client refuses line breaks and NUL): control tokens, printable ASCII.
HOSTILE_HEADER = st.lists(st.one_of(st.sampled_from(CONTROL), st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e),
                                                                       max_size=8)), min_size=1, max_size=6).map("".join)


@dataclass(frozen=True)
class LongNumber:
    """An integer of more digits than Python reads (4,300), which json.dumps cannot write either."""

    digits: int


_MARK = f"long-{os.getpid()}-{id(LongNumber)}-"  # written as a string first, then as the digits


def _dumps(body: object) -> str:
    text = json.dumps(body, default=lambda o: f"{_MARK}{o.digits}")
    return re.sub(f'"{re.escape(_MARK)}(\\d+)"', lambda m: "7" * int(m[1]), text)


def send(app, path: str, body: object, headers: dict | None = None) -> tuple[int, str, bytes]:
    """Written by json.dumps as is: NaN, Infinity and huge integers go through as JSON parsers accept them."""
    data = body if isinstance(body, bytes) else _dumps(body).encode()
    request = urllib.request.Request(app.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read()


def check_answer(path: str, status: int, kind: str, data: bytes) -> None:
    assert status < 500, data[:2000]
    anthropic = path.startswith("/v1/messages")
    if status >= 400:
        answer = json.loads(data)
        error = answer["error"]
        assert isinstance(error["message"], str) and error["message"], error
        keys = {"message", "type"} if anthropic else {"message", "type", "param", "code"}
        assert isinstance(error["type"], str) and set(error) == keys, error
        assert not anthropic or answer["type"] == "error", answer
        return
    if kind.startswith("text/event-stream"):
        text = data.decode()
        if anthropic:
            assert "event: message_stop" in text or "event: error" in text, text[-500:]
        elif path.endswith("completions"):
            assert text.rstrip().endswith("data: [DONE]"), text[-500:]
        else:
            assert "event: response.completed" in text or "event: response.failed" in text, text[-500:]
    else:
        json.loads(data)


@pytest.fixture(scope="module")
def app(replay_app):
    before = replay_app.runtime.backend
    replay_app.runtime.backend = Capture(replay_app.runtime.vocab)
    yield replay_app
    replay_app.runtime.backend = before
    report = os.environ.get("LOOPTRACE_FUZZ_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps(dict(TRIED)) + "\n")


# ---------------------------------------------------------------------------------------------
# Any body at all
# ---------------------------------------------------------------------------------------------

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-(2**300), 2**300),
                    st.integers(4_301, 20_000).map(LongNumber),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-300, 5e-324, 1e308, -0.0]),
                    HOSTILE, st.text(max_size=30))
JUNK = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(HOSTILE, inner, max_size=4)), max_leaves=12)
DEEP = st.integers(1, 300).map(lambda depth: json.loads("[" * depth + "]" * depth))
HUGE = st.sampled_from(["x" * 200_000, ["y"] * 5_000, {str(i): i for i in range(3_000)}])
ANY = st.one_of(JUNK, DEEP, HUGE)


def plausible(values: list, junk: bool) -> st.SearchStrategy:
    """Mostly a value the API takes, so that some bodies get through to decoding; otherwise junk."""
    good = st.sampled_from(values)
    return st.one_of(good, good, good, ANY) if junk else good


CHAT_FIELDS = {
    "temperature": [0, 0.7, 2], "top_p": [0.9, 1], "top_k": [0, 20],
    "max_tokens": [1, 4, 0, -1], "max_completion_tokens": [3], "seed": [1, 2**64 - 1],
    "stop": [["x"], "y", []], "stream": [True, False],
    "stream_options": [{"include_usage": True}], "tool_choice": ["auto", "none", "required"],
    "parallel_tool_calls": [True, False], "logprobs": [True], "top_logprobs": [2, 20],
    "presence_penalty": [0.5, -2], "frequency_penalty": [1],
    "reasoning_effort": ["none", "high"], "chat_template_kwargs": [{"enable_thinking": True}],
    "tools": [[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]],
    "n": [1, 2], "response_format": [{"type": "json_object"}], "user": ANY,
}
RESPONSES_FIELDS = {
    "instructions": ["Be brief."], "max_output_tokens": [4, 0, -5],
    "temperature": [0.5], "top_p": [1], "stream": [True, False],
    "store": [True, False], "previous_response_id": ["resp_x"],
    "reasoning": [{"effort": "none"}, {"effort": "low", "summary": "auto"}],
    "include": [["reasoning.encrypted_content"]], "tool_choice": ["auto", "required"],
    "tools": [[{"type": "function", "name": "f", "parameters": {"type": "object"}}]],
    "parallel_tool_calls": [False], "text": [{"format": {"type": "text"}}],
    "truncation": ["auto"], "metadata": ANY,
}
MESSAGES = [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                   "function": {"name": "f", "arguments": "{"}}]}]]
INPUT = ["Hi", [{"role": "user", "content": "Hi"}], [{"type": "function_call_output", "call_id": "c", "output": "x"}]]
ANTHROPIC_FIELDS = {
    "system": ["Be brief.", [{"type": "text", "text": "Be brief."}]], "temperature": [0, 0.5, 1, 2],
    "top_p": [0.9], "top_k": [0, 20], "stream": [True, False], "stop_sequences": [["x"], []],
    "thinking": [{"type": "enabled", "budget_tokens": 1}, {"type": "disabled"}, {"type": "adaptive"}],
    "tools": [[{"name": "f", "input_schema": {"type": "object"}}], [{"type": "web_search_20250305", "name": "w"}]],
    "tool_choice": [{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "f"}, {"type": "none"}],
    "metadata": [{"user_id": "u"}, None], "context_management": ANY, "output_config": ANY,
}
ANTHROPIC_MESSAGES = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}],
    [{"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                       {"type": "tool_use", "id": "c", "name": "f", "input": {"a": 1}}]},
     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": [
         {"type": "text", "text": "x"}, {"type": "tool_reference", "tool_name": "f"}], "is_error": True}]}],
]


def body(head: dict, fields: dict) -> st.SearchStrategy:
    """A body of the API's fields: each a value it takes or junk, or (half the time) all values it takes."""
    def shape(junk: bool) -> st.SearchStrategy:
        def one(v):
            return v if isinstance(v, st.SearchStrategy) else plausible(v, junk)
        return st.fixed_dictionaries({k: one(v) for k, v in head.items()},
                                     optional={k: one(v) for k, v in fields.items()})
    return st.one_of(shape(True), shape(False))


@pytest.mark.parametrize(("path", "shape"), [
    ("/v1/chat/completions", body({"model": [MODEL], "messages": MESSAGES}, CHAT_FIELDS)),
    ("/v1/responses", body({"model": [MODEL], "input": INPUT}, RESPONSES_FIELDS)),
    ("/v1/messages", body({"model": [MODEL], "max_tokens": [1, 4, 0], "messages": ANTHROPIC_MESSAGES},
                          ANTHROPIC_FIELDS)),
], ids=["chat", "responses", "messages"])
def test_no_body_gets_a_5xx(app, path, shape):
    @FUZZ
    @given(shape)
    def one(b):
        status, kind, data = send(app, path, b)
        TRIED[f"any {path} {status // 100}xx"] += 1
        check_answer(path, status, kind, data)

    one()
    assert app.call("GET", "/health")[0] == 200


# ---------------------------------------------------------------------------------------------
# Hostile strings in a conversation: the prompt's control tokens are the template's alone
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)  # each slot its own key, even with equal strings
class Slot:
    """A client string, hostile, with its clean twin: the same conversation written harmlessly."""

    hostile: str
    clean: str


@dataclass(frozen=True)
class Arguments:
    """A tool call's arguments, sent as a JSON string once its slots are filled."""

    value: dict


def fill(value, clean: bool):
    if isinstance(value, Slot):
        return value.clean if clean else value.hostile
    if isinstance(value, Arguments):
        return json.dumps(fill(value.value, clean))
    if isinstance(value, dict):
        return {fill(k, clean): fill(v, clean) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, clean) for v in value]
    return value


@st.composite
def conversation(draw, api: str):
    n = iter(range(10**6))

    def text() -> Slot:
        hostile = draw(HOSTILE)
        # Emptiness kept: a template may render an empty field differently (no reasoning block).
        return Slot(hostile, f"x{next(n)}" if hostile.strip() else hostile)

    def name() -> Slot:  # ids and names: the clean twin's are never empty (an empty one is refused)
        return Slot(draw(HOSTILE), f"x{next(n)}")

    def schema() -> dict:
        props = {name(): {"type": "string", "description": text(), "enum": [text(), text()]} for _ in range(2)}
        return {"type": "object", "properties": props}

    call_id, function, tool = name(), name(), name()
    arguments = Arguments({name(): text(), name(): {name(): [text(), 1]}})
    forced = draw(st.booleans())  # tool_choice naming the tool: its forced opening written after the prompt
    if api == "messages":
        return messages_conversation(text, tool, schema, call_id, function, arguments.value,
                                     Slot(draw(HOSTILE_HEADER), f"x{next(n)}"), forced, name)
    if api == "chat":
        return {"model": MODEL, "max_tokens": 2, "messages": [
            {"role": "system", "content": text()},
            {"role": "user", "content": text(), "name": name()},
            {"role": "assistant", "content": text(), "reasoning_content": text(),
             "tool_calls": [{"id": call_id, "type": "function", "function": {"name": function, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "content": text()},
            {"role": "user", "content": [{"type": "text", "text": text()}]},
        ], "tools": [{"type": "function", "function": {"name": tool, "description": text(), "parameters": schema()}}],
            **({"tool_choice": {"type": "function", "function": {"name": tool}}} if forced else {})}
    return {"model": MODEL, "max_output_tokens": 2, "instructions": text(), "input": [
        {"role": "user", "content": text()},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": text()}]},
        {"type": "function_call", "call_id": call_id, "name": function, "arguments": arguments},
        {"type": "function_call_output", "call_id": call_id, "output": text()},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text()}]},
    ], "tools": [{"type": "function", "name": tool, "description": text(), "parameters": schema()}],
        **({"tool_choice": {"type": "function", "name": tool}} if forced else {})}


def messages_conversation(text, tool, schema, call_id, function, arguments, session, forced,
                          name) -> dict:
    """Anthropic's shapes: system blocks, thinking, tool_use with an object input, tool_result as a
    string and as blocks (an error), input_schema, Claude Code's session header (`_headers`), and
    maybe tool_choice naming the tool."""
    again = name()
    return {"model": MODEL, "max_tokens": 2, "thinking": {"type": "adaptive"},
            "system": [{"type": "text", "text": text()}, {"type": "text", "text": text()}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": text()}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": text(), "signature": text()},
                                                  {"type": "text", "text": text()},
                                                  {"type": "tool_use", "id": call_id, "name": function,
                                                   "input": arguments}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text()},
                                             {"type": "text", "text": text()}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": text(), "signature": text()},
                                                  {"type": "tool_use", "id": again, "name": function,
                                                   "input": {name(): text()}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": again, "is_error": True,
                                              "content": [{"type": "text", "text": text()}]}]},
            ], "tools": [{"name": tool, "description": text(), "input_schema": schema()}],
            **({"tool_choice": {"type": "tool", "name": tool}} if forced else {}),
            "_headers": {"X-Claude-Code-Session-Id": session}}


def control_ids(app) -> set[int]:
    tokenizer = app.runtime.tokenizer
    return set(getattr(tokenizer, "added_tokens_decoder", {}))


@pytest.mark.parametrize(("path", "api"), [("/v1/chat/completions", "chat"), ("/v1/responses", "responses"),
                                           ("/v1/messages", "messages")], ids=["chat", "responses", "messages"])
def test_hostile_strings_never_become_control_tokens(app, path, api):
    control = control_ids(app)
    prompts = app.runtime.backend.prompts

    @FUZZ
    @given(conversation(api))
    def one(conv):
        outcomes = []
        for clean in (False, True):
            request = fill(conv, clean)
            status, kind, data = send(app, path, request, request.pop("_headers", None))
            TRIED[f"hostile {path} {status // 100}xx"] += 1
            check_answer(path, status, kind, data)
            outcomes.append((status, prompts[-1] if status == 200 and prompts else None))
            prompts.clear()
        (status, hostile), (clean_status, clean) = outcomes
        assert clean_status == 200
        if status == 200:
            assert [i for i in hostile if i in control] == [i for i in clean if i in control]

    one()
    assert app.call("GET", "/health")[0] == 200


@pytest.mark.parametrize("thinking", [False, True])
def test_a_forced_tool_name_never_becomes_control_tokens(app, thinking):
    """Below the APIs' rule on names (which refuses most of these): the engine writes whatever name
    tool_choice forces as text, so the prompt's control tokens are those of a plain name."""
    from looptrace.proxy.engine.generation import Generation
    from looptrace.proxy.engine.request import GenerationRequest

    control = control_ids(app)

    def forced(name: str) -> list[int]:
        tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]
        generation = Generation(app.runtime, GenerationRequest(
            messages=[{"role": "user", "content": "hi"}], tools=tools, tool_choice={"name": name},
            enable_thinking=thinking, max_tokens=2))
        generation._prepare()
        return [i for i in generation.prompt_ids if i in control]

    plain = forced("f")

    @FUZZ  # a lone surrogate never gets this far: the API reads it as U+FFFD (api/validation.py)
    @given(HOSTILE.filter(bool).map(lambda s: "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in s)))
    def one(name):
        TRIED["forced tool name"] += 1
        assert forced(name) == plain

    one()


# ---------------------------------------------------------------------------------------------
# Many small items, and images that are headers alone (issue 31): refused in a moment, never a 5xx
# ---------------------------------------------------------------------------------------------

# Issue 31's goal is a second on a quiet machine; CI's is shared, and a body of 600,000 items is 20 MB
# to send: what is measured is the gap to the 15-180 s these took before.
MOMENT = 10.0


def test_many_small_items_are_answered_in_a_moment(app):
    import time

    import many_items

    @FUZZ
    @given(many_items.bodies(MODEL))
    def one(drawn):
        kind, n, path, data = drawn
        started = time.perf_counter()
        status, kind_of_answer, answer = send(app, path, data)
        seconds = time.perf_counter() - started
        TRIED[f"many {kind} {status // 100}xx"] += 1
        check_answer(path, status, kind_of_answer, answer)
        assert seconds < MOMENT, (kind, n, seconds, answer[:300])

    one()
    assert app.call("GET", "/health")[0] == 200


@pytest.fixture(scope="module")
def image_app(qwen3_5_dir, tmp_path_factory):
    """The tiny Qwen3.5 with its real image processing, replaying "Ok." (a context of 8,192)."""
    from looptrace.proxy.settings import Settings

    from app_thread import AppThread
    from tiny_media import with_images

    folder = tmp_path_factory.mktemp("fuzz-images")
    (folder / "steps.jsonl").write_text('{"text": "Ok.<|im_end|>"}\n')
    served = AppThread(Settings(model=str(with_images(qwen3_5_dir, "qwen3_5")), backend="replay",
                                replay=str(folder / "steps.jsonl"), served_model_name=MODEL, max_model_len=8192,
                                trace_db="off")).start()
    served.runtime.backend = Capture(served.runtime.vocab)
    yield served
    served.stop()


def test_large_image_headers_are_refused_from_the_header(image_app):
    import time

    import image_headers

    @FUZZ
    @given(st.lists(image_headers.large_headers(), min_size=1, max_size=4), st.sampled_from(["chat", "responses"]))
    def one(headers, api):
        urls = [image_headers.data_url(*h) for h in headers]
        if api == "chat":
            path = "/v1/chat/completions"
            parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": "?"}]
            body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": parts}]}
        else:
            path = "/v1/responses"
            parts = [{"type": "input_image", "image_url": u} for u in urls] + [{"type": "input_text", "text": "?"}]
            body = {"model": MODEL, "max_output_tokens": 2, "input": [{"role": "user", "content": parts}]}
        started = time.perf_counter()
        status, kind, data = send(image_app, path, body)
        TRIED[f"image headers {path} {status // 100}xx"] += 1
        check_answer(path, status, kind, data)
        assert time.perf_counter() - started < MOMENT, (headers, data[:300])
        pixels = sum(w * h for _, w, h in headers)
        if status == 200:  # what is taken fits every limit (a header alone decodes when it is tiny)
            assert pixels <= 33_554_432, headers
        elif pixels > 33_554_432:  # refused for its size, from the header: never for the missing pixels
            assert json.loads(data)["error"]["code"] in ("media_too_large", "context_length_exceeded"), data

    one()
    assert image_app.call("GET", "/health")[0] == 200
