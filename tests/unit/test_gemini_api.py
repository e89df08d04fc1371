"""The Gemini API (/v1beta/models/…) through the real app on the tiny Qwen3.5, as Gemini CLI and the
google-genai SDK (the version pinned in pyproject.toml's test extra) speak it: every answer and
streamed response validated against the SDK's own types; the SDK's generate_content,
generate_content_stream, a function call round trip and count_tokens; the prompt the contents render
to; errors in Google's shape; the key as x-goog-api-key or ?key=; the request traced as `gemini`."""

from __future__ import annotations

import json
import secrets

import pytest
from google import genai
from google.genai import errors, types

from looptrace.proxy.api import streaming
from looptrace.proxy.api.errors import APIError
from looptrace.proxy.api.gemini.request import json_schema, parse_generate
from looptrace.proxy.settings import Settings

from app_thread import AppThread, Wrapped
from messages_api import Capture, post_messages, qwen_call

MODEL = "tiny-qwen"
REASONED = "Let me think.\n</think>\n\nThe answer is 4.<|im_end|>"
CALL = "I will list them.\n</think>\n\n" + qwen_call("run_shell_command", command="ls -la") + "<|im_end|>"
SHELL = {"name": "run_shell_command", "description": "Run a shell command.",
         "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}},
                                  "required": ["command"]}}
ASK = [{"role": "user", "parts": [{"text": "2+2?"}]}]


def path(action: str, model: str = MODEL) -> str:
    return f"/v1beta/models/{model}:{action}"


def sdk(app, key: str = "unused", version: str | None = None) -> genai.Client:
    """The SDK pointed at the app; `version` None: its default, /v1 (Gemini CLI's is /v1beta)."""
    return genai.Client(api_key=key, http_options=types.HttpOptions(
        base_url=app.url, api_version=version, retry_options=types.HttpRetryOptions(attempts=1)))


def sse(data: bytes) -> list[dict]:
    """Each `data:` event of a stream, read strictly: nothing but data lines, no [DONE]."""
    out = []
    for block in data.decode().split("\n\n"):
        if block.strip():
            assert block.startswith("data: ") and "\n" not in block, block
            out.append(json.loads(block[len("data: "):]))
    return out


@pytest.mark.parametrize(("recorded", "extra", "reason"), [
    (REASONED, {}, "STOP"),
    (CALL, {"tools": [{"functionDeclarations": [SHELL]}]}, "STOP"),
    ("Cut short by the budget, never finished", {"generationConfig": {"maxOutputTokens": 3}}, "MAX_TOKENS"),
    ("\n</think>\n\nOne, two, three, four.<|im_end|>", {"generationConfig": {"stopSequences": ["three"]}}, "STOP"),
    ("\n</think>\n\n<tool_call>\n<function=run_shell_command>\nnot a call<|im_end|>",
     {"tools": [{"functionDeclarations": [SHELL]}]}, "MALFORMED_FUNCTION_CALL"),
])
def test_answers_and_streams_are_sdk_responses(replay_app, recorded, extra, reason):
    replay_app.replay(recorded, recorded)
    status, data = post_messages(replay_app, {"contents": ASK, **extra}, path=path("generateContent"))
    assert status == 200, data
    whole = types.GenerateContentResponse.model_validate(json.loads(data))
    assert whole.candidates[0].finish_reason == reason
    status, data = post_messages(replay_app, {"contents": ASK, **extra},
                                 path=path("streamGenerateContent") + "?alt=sse")
    assert status == 200, data
    chunks = [types.GenerateContentResponse.model_validate(c) for c in sse(data)]
    # Only the last says why it ended, and holds the usage; the parts add up to the whole answer's.
    assert [c.candidates[0].finish_reason for c in chunks][-1] == reason
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1])
    assert chunks[-1].usage_metadata.prompt_token_count == whole.usage_metadata.prompt_token_count > 0
    streamed = "".join(p.text or "" for c in chunks for p in c.candidates[0].content.parts)
    assert streamed == "".join(p.text or "" for p in whole.candidates[0].content.parts)


def test_without_alt_sse_the_stream_is_one_json_array(replay_app):
    replay_app.replay(REASONED)
    status, data = post_messages(replay_app, {"contents": ASK}, path=path("streamGenerateContent"))
    assert status == 200, data
    chunks = [types.GenerateContentResponse.model_validate(c) for c in json.loads(data)]
    assert "".join(c.text or "" for c in chunks) == "The answer is 4."
    assert chunks[-1].candidates[0].finish_reason == "STOP"


@pytest.mark.parametrize("version", [None, "v1beta"])
def test_the_sdk_generates_streams_and_sees_thoughts_when_asked(replay_app, version):
    client = sdk(replay_app, version=version)
    replay_app.replay(REASONED, REASONED, REASONED)
    plain = client.models.generate_content(model=MODEL, contents="2+2?")
    assert plain.text == "The answer is 4." and plain.usage_metadata.thoughts_token_count > 0
    # Under any model name (Gemini CLI asks for several): served by the one model, which modelVersion names.
    thinking = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))
    shown = client.models.generate_content(model="gemini-2.5-flash-lite", contents="2+2?", config=thinking)
    assert [(p.thought, p.text) for p in shown.candidates[0].content.parts] == [
        (True, "Let me think."), (None, "The answer is 4.")]
    assert shown.model_version == MODEL
    streamed = list(client.models.generate_content_stream(model=MODEL, contents="2+2?", config=thinking))
    assert "".join(c.text or "" for c in streamed) == "The answer is 4."
    assert "".join(p.text for c in streamed for p in c.candidates[0].content.parts if p.thought) == "Let me think."


def test_a_function_call_round_trip_through_the_sdk(replay_app):
    client = sdk(replay_app)
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[types.FunctionDeclaration(
        name="run_shell_command", description="Run a shell command.",
        parameters_json_schema=SHELL["parametersJsonSchema"])])])
    replay_app.replay(CALL)
    asked = types.Content(role="user", parts=[types.Part(text="List the files.")])
    answer = client.models.generate_content(model=MODEL, contents=[asked], config=config)
    (call,) = answer.function_calls
    assert (call.name, call.args) == ("run_shell_command", {"command": "ls -la"}) and call.id.startswith("call_")
    capture = Capture(replay_app.runtime.vocab, "\n</think>\n\nTwo files.<|im_end|>")
    before, replay_app.runtime.backend = replay_app.runtime.backend, capture
    try:
        result = types.Part.from_function_response(name=call.name, response={"output": "a.txt\nb.txt"})
        result.function_response.id = call.id
        followed = client.models.generate_content(model=MODEL, config=config, contents=[
            asked, answer.candidates[0].content, types.Content(role="user", parts=[result])])
    finally:
        replay_app.runtime.backend = before
    assert followed.text == "Two files."
    prompt = replay_app.runtime.tokenizer.decode(capture.prompts.pop())
    assert "<function=run_shell_command>\n<parameter=command>\nls -la" in prompt
    assert "<tool_response>\na.txt\nb.txt\n</tool_response>" in prompt


def test_count_tokens_is_the_prompt_generate_reads(replay_app):
    client = sdk(replay_app)
    counted = client.models.count_tokens(model=MODEL, contents="2+2?")
    types.CountTokensResponse.model_validate(counted.model_dump())
    replay_app.replay(REASONED)
    answer = client.models.generate_content(model=MODEL, contents="2+2?")
    assert counted.total_tokens == answer.usage_metadata.prompt_token_count > 0
    # A whole generateContentRequest counts its system instruction and tools too.
    status, data = post_messages(replay_app, {"generateContentRequest": {
        "contents": ASK, "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "tools": [{"functionDeclarations": [SHELL]}]}}, path=path("countTokens"))
    assert status == 200 and json.loads(data)["totalTokens"] > counted.total_tokens + 10, data


def test_the_models_are_listed_and_found(replay_app):
    client = sdk(replay_app, version="v1beta")
    listed = list(client.models.list())
    assert [m.name for m in listed] == [f"models/{MODEL}"]
    found = client.models.get(model=MODEL)
    assert found.name == f"models/{MODEL}" and "generateContent" in found.supported_actions


@pytest.fixture
def capture(replay_app):
    before = replay_app.runtime.backend
    replay_app.runtime.backend = Capture(replay_app.runtime.vocab)
    yield replay_app.runtime.backend
    replay_app.runtime.backend = before


def prompt_of(app, capture, body: dict) -> str:
    status, data = post_messages(app, body, path=path("generateContent"))
    assert status == 200, data
    return app.runtime.tokenizer.decode(capture.prompts.pop())


def test_contents_render_with_the_template(replay_app, capture):
    prompt = prompt_of(replay_app, capture, {
        "systemInstruction": {"parts": [{"text": "You are terse."}]},
        "tools": [{"functionDeclarations": [{"name": "read_file", "parameters": {
            "type": "OBJECT", "properties": {"path": {"type": "STRING"}}, "required": ["path"]}}]}],
        "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}},
        "contents": [
            {"role": "user", "parts": [{"text": "Read it."}]},
            # No call ids: paired by name, as Gemini pairs them; a thought part is the turn's reasoning; a
            # part of only a signature is nothing to render.
            {"role": "model", "parts": [{"text": "Hmm.", "thought": True}, {"thoughtSignature": "c2ln"},
                                        {"functionCall": {"name": "read_file", "args": {"path": "a.txt"}},
                                         "thoughtSignature": "c2lnbmF0dXJl"}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"content": 42}}},
                                       {"text": "And now?"}]}]})
    assert prompt.startswith("<|im_start|>system\n") and prompt.index("You are terse.") < prompt.index("Read it.")
    assert '"path": {"type": "string"}' in prompt  # Google's capitals, as JSON Schema
    assert "<function=read_file>\n<parameter=path>\na.txt" in prompt
    assert '<tool_response>\n{"content":42}\n</tool_response>' in prompt
    assert prompt.index("</tool_response>") < prompt.index("And now?")
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinkingBudget 0: off
    assert "Hmm." not in prompt  # reasoning, which the template drops before the last question


def test_thought_parts_are_the_turns_reasoning(replay_app, capture):
    prompt = prompt_of(replay_app, capture, {"contents": [
        {"role": "user", "parts": [{"text": "Read it."}]},
        {"role": "model", "parts": [{"text": "I should ", "thought": True}, {"text": "read it.", "thought": True},
                                    {"functionCall": {"id": "c1", "name": "read_file", "args": {"path": "a"}}}]},
        {"role": "function", "parts": [{"functionResponse": {"id": "c1", "name": "read_file",
                                                             "response": {"output": "hello"}}}]}]})
    assert "<think>\nI should read it.\n</think>" in prompt and "<tool_response>\nhello\n</tool_response>" in prompt


def test_gemini_clis_json_mode_utility_call_is_answered(replay_app, capture):
    """As its model router sends one: no role, JSON asked for by schema (not enforced), a thinking level."""
    prompt = prompt_of(replay_app, capture, {
        "contents": [{"parts": [{"text": "Score the task."}]}], "systemInstruction": {"parts": [{"text": "Judge."}]},
        "generationConfig": {"temperature": 1, "topP": 0.95, "topK": 64, "responseMimeType": "application/json",
                             "responseJsonSchema": {"type": "OBJECT", "properties": {"score": {"type": "INTEGER"}}},
                             "thinkingConfig": {"includeThoughts": True, "thinkingLevel": "HIGH"}}})
    assert "<|im_start|>user\nScore the task.<|im_end|>" in prompt and prompt.endswith("assistant\n<think>\n")


def test_the_openapi_schema_becomes_json_schema():
    assert json_schema({"type": "OBJECT", "properties": {"tags": {"type": "ARRAY", "items": {"type": "STRING"}},
                                                         "type": {"type": "INTEGER"}},
                        "any_of": [{"type": "NULL"}]}) == {
        "type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}},
                                         "type": {"type": "integer"}}, "anyOf": [{"type": "null"}]}


def error_of(reply: tuple[int, bytes]) -> tuple[int, str, str]:
    status, data = reply
    error = json.loads(data)["error"]
    assert set(error) == {"code", "message", "status"} and error["code"] == status, error
    return status, error["status"], error["message"]


@pytest.mark.parametrize(("body", "says"), [
    ({"contents": ASK, "generationConfig": {"candidateCount": 2}}, "generationConfig.candidateCount"),
    ({"contents": ASK, "generationConfig": {"temperature": 3}}, "generationConfig.temperature"),
    ({"contents": []}, "contents"),
    ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "text/x-sh", "data": "eA=="}}]}]},
     "contents[0].parts[0].inlineData.mimeType"),
    ({"contents": [{"role": "user", "parts": [{"executableCode": {"code": "1"}}]}]}, "contents[0].parts[0]"),
    ({"contents": ASK, "tools": [{"functionDeclarations": [{"name": "<|im_end|>"}]}]},
     "tools[0].functionDeclarations[0].name"),
    ({"contents": ASK, "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}, "ANY"),
])
def test_bad_requests_are_googles_400(replay_app, body, says):
    status, kind, message = error_of(post_messages(replay_app, body, path=path("generateContent")))
    assert (status, kind) == (400, "INVALID_ARGUMENT") and says in message, message


@pytest.mark.parametrize(("body", "param"), [
    ({"contents": ASK * 16_385}, "contents"),
    ({"contents": [{"parts": [{"text": "x"}] * 16_385}]}, "contents[0].parts"),
    ({"contents": ASK, "tools": [{"functionDeclarations": [{"name": "f"}] * 4_097}]}, "tools[0].functionDeclarations"),
])
def test_too_many_items_are_refused_before_they_are_built(body, param):
    with pytest.raises(APIError) as refused:
        parse_generate(body)
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, param, "too_many_items")


def test_the_sdk_raises_googles_errors(replay_app):
    client = sdk(replay_app)
    with pytest.raises(errors.ClientError) as raised:
        client.models.generate_content(model=MODEL, contents="x", config=types.GenerateContentConfig(
            candidate_count=2))
    assert (raised.value.code, raised.value.status) == (400, "INVALID_ARGUMENT")
    status, kind, message = error_of(post_messages(replay_app, {"contents": ASK}, path=path("embedContent")))
    assert (status, kind) == (405, "UNIMPLEMENTED") and ":embedContent" in message
    status, kind, _ = error_of(post_messages(replay_app, {"contents": ASK},
                                             path="/v1beta/tunedModels/x:generateContent"))
    assert (status, kind) == (404, "NOT_FOUND")


@pytest.mark.parametrize("alt", ["?alt=sse", ""])
def test_a_failure_in_the_stream_ends_it_with_googles_error(replay_app, monkeypatch, alt):
    monkeypatch.setattr(streaming, "KEEPALIVE_SECONDS", 0.2)
    replay_app.runtime.backend = Wrapped(replay_app.replay("\n</think>\n\nNever finished.<|im_end|>"), fail_after=5)
    status, data = post_messages(replay_app, {"contents": ASK}, path=path("streamGenerateContent") + alt)
    assert status == 200, data
    *chunks, last = sse(data) if alt else json.loads(data)
    for chunk in chunks:
        types.GenerateContentResponse.model_validate(chunk)
    assert set(last["error"]) == {"code", "message", "status"} and last["error"]["status"] == "UNAVAILABLE", last


@pytest.fixture(scope="module")
def keyed(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("keyed")
    (folder / "steps.jsonl").write_text('{"text": "Ok.<|im_end|>"}\n')
    app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "steps.jsonl"),
                             served_model_name=MODEL, api_key="sk-test", trace_db=str(folder / "t.sqlite3"))).start()
    app.runtime.backend = Capture(app.runtime.vocab, "\n</think>\n\nOk.<|im_end|>")
    yield app
    app.stop()


def test_the_key_as_x_goog_api_key_or_in_the_query(keyed):
    client = sdk(keyed, "sk-test")
    assert client.models.generate_content(model=MODEL, contents="x").text == "Ok."
    body = {"contents": ASK}
    assert post_messages(keyed, body, path=path("generateContent") + "?key=sk-test")[0] == 200
    assert post_messages(keyed, body, {"Authorization": "Bearer sk-test"}, path=path("generateContent"))[0] == 200
    assert error_of(post_messages(keyed, body, {"x-goog-api-key": "sk-wrong"}, path=path("generateContent")))[:2] == (
        401, "UNAUTHENTICATED")
    assert error_of(post_messages(keyed, body, path=path("countTokens")))[:2] == (401, "UNAUTHENTICATED")


def test_a_gemini_request_is_traced(replay_app):
    replay_app.replay(CALL)
    trace_id = secrets.token_hex(16)
    status, data = post_messages(replay_app, {"contents": ASK, "tools": [{"functionDeclarations": [SHELL]}]}, {
        "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01", "User-Agent": "GeminiCLI/0.61.0 (linux; x64)"},
        path=path("streamGenerateContent", "gemini-2.5-pro") + "?alt=sse")
    assert status == 200, data
    trace = replay_app.stored(f"/v1/traces/{trace_id}", timeout=30)
    root = next(s for s in trace["spans"] if s["attributes"].get("looptrace.endpoint"))["attributes"]
    assert root["looptrace.endpoint"] == "gemini" and root["gen_ai.request.model"] == MODEL
    assert root["looptrace.client.name"] == "GeminiCLI"
    assert any(s["name"].startswith("execute_tool") for s in trace["spans"])
    # The name the path asked for beside the served model; nothing it did not ask for.
    assert root["looptrace.request.model_asked"] == "gemini-2.5-pro"
    assert not {"looptrace.request.response_mime_type", "looptrace.request.response_schema",
                "looptrace.request.thinking_budget", "looptrace.request.thinking_level"} & set(root)


@pytest.mark.parametrize("field", ["responseJsonSchema", "responseSchema"])
def test_what_a_utility_call_asks_for_and_is_not_enforced_is_traced(replay_app, field):
    """A JSON-mode call as Gemini CLI makes one, under another model's name: the name, the MIME type,
    the schema (as given) and the thinking budget and level on its trace, served by the one model."""
    replay_app.replay(REASONED)
    trace_id = secrets.token_hex(16)
    schema = {"type": "OBJECT", "properties": {"score": {"type": "INTEGER"}}}
    status, data = post_messages(replay_app, {"contents": ASK, "generationConfig": {
        "responseMimeType": "application/json", field: schema,
        "thinkingConfig": {"thinkingBudget": 512, "thinkingLevel": "LOW"}}},
        {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}, path=path("generateContent", "flash-lite"))
    assert status == 200 and json.loads(data)["modelVersion"] == MODEL, data
    trace = replay_app.stored(f"/v1/traces/{trace_id}", timeout=30)
    root = next(s for s in trace["spans"] if s["attributes"].get("looptrace.endpoint"))["attributes"]
    assert root["gen_ai.request.model"] == root["gen_ai.response.model"] == MODEL
    assert root["looptrace.request.model_asked"] == "flash-lite"
    assert root["looptrace.request.response_mime_type"] == "application/json"
    assert json.loads(root["looptrace.request.response_schema"]) == schema
    assert (root["looptrace.request.thinking_budget"], root["looptrace.request.thinking_level"]) == (512, "LOW")


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


def test_an_inline_image_reaches_the_prompt(seeing):
    import base64
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 48), (220, 30, 30)).save(out, "PNG")
    image = {"inlineData": {"mimeType": "image/png", "data": base64.b64encode(out.getvalue()).decode()}}
    trace_id = secrets.token_hex(16)
    body = {"contents": [{"role": "user", "parts": [{"text": "What is this?"}, image]}]}
    status, data = post_messages(seeing, body, {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
                                 path=path("generateContent"))
    assert status == 200, data
    render = next(s for s in seeing.stored(f"/v1/traces/{trace_id}")["spans"] if s["name"] == "render")["attributes"]
    (item,) = json.loads(render["looptrace.prompt.media"])
    assert (item["kind"], item["param"], item["width"]) == ("image", "contents[0].parts[1].inlineData.data", 64)
    assert item["tokens"] > 0
