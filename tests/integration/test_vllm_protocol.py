"""The field names looptrace sends to vLLM, and those the test double sends back, are vLLM's own.

vLLM's OpenAI request models accept unknown fields silently (`extra="allow"`), so a misspelt
setting would simply do nothing; and a double whose chunks were guessed would let the backend
pass against a protocol no vLLM speaks. So the protocol modules of the pinned vllm wheel
(VLLM_VERSION) are read here: downloaded once with `pip download --no-deps` into the test cache,
the few protocol files taken out with zipfile, and each model's fields read with `ast` (vLLM is
never imported: it needs CUDA). Without the wheel these tests fail; they never skip.
"""

from __future__ import annotations

import ast
import asyncio
import json
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from looptrace.backends.base import DecodeRequest, SamplingParams
from looptrace.backends.vllm import protocol as protocol
from looptrace.backends.vllm.backend import Pool, Upstream, VLLMBackend
from looptrace.common.vocabulary import Vocabulary

import build_cache
import packaged
import tiny_qwen3_5
from server import free_port
from vllm_double import VLLM_VERSION, DoubleProcess

# The relay benchmark's double adds vLLM's chat route (bench/_vllm_chat.py); its chunks are checked here too.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _vllm_chat import ChatDoubleProcess  # noqa: E402

FILES = (
    "vllm/entrypoints/openai/completion/protocol.py",  # CompletionRequest, CompletionStreamResponse, ...
    "vllm/entrypoints/generate/base/protocol.py",  # StreamOptions, PerRequestMetrics, SpeculativeDecodingMetrics
    "vllm/entrypoints/serve/engine/protocol.py",  # ErrorResponse, ModelList, ModelCard, UsageInfo
    "vllm/entrypoints/scale_out/token_in_token_out/protocol.py",  # GenerateRequest, GenerateTokensStreamResponse
    "vllm/entrypoints/openai/chat_completion/protocol.py",  # ChatCompletionRequest, ChatCompletionStreamResponse
    "vllm/sampling_params.py",  # SamplingParams
    "vllm/entrypoints/scale_out/token_in_token_out/serving.py",  # how the generate route reads content_parts
)
SERVING = FILES[-1]
KEY = "protocol-key"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


# ---------------------------------------------------------------------------------------------
# vLLM's models, read from the wheel
# ---------------------------------------------------------------------------------------------


@dataclass
class Model:
    bases: list[str]
    fields: dict[str, bool]  # JSON name → required
    defaults: dict[str, object]  # literal defaults of class attributes, private ones included


def _field_call(value: ast.expr | None) -> ast.Call | None:
    name = getattr(value.func, "id", getattr(value.func, "attr", None)) if isinstance(value, ast.Call) else None
    if name in ("Field", "field"):
        return value
    return None


def _read_models(source: str) -> dict[str, Model]:
    models = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields, defaults = {}, {}
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                try:
                    defaults[stmt.targets[0].id] = ast.literal_eval(stmt.value)
                except ValueError:
                    pass
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            name = stmt.target.id
            annotation = ast.unparse(stmt.annotation)
            if annotation.startswith("ClassVar") or name == "model_config":
                continue
            if stmt.value is not None:
                try:
                    defaults[name] = ast.literal_eval(stmt.value)
                except ValueError:
                    pass
            if name.startswith("_"):
                continue
            call = _field_call(stmt.value)
            keywords = {k.arg: k.value for k in call.keywords} if call else {}
            alias = keywords.get("alias")
            key = alias.value if isinstance(alias, ast.Constant) else name
            if call is not None:
                has_default = "default" in keywords or "default_factory" in keywords or (
                    call.args and not (isinstance(call.args[0], ast.Constant) and call.args[0].value is Ellipsis))
                fields[key] = not has_default
            else:
                fields[key] = stmt.value is None
        models[node.name] = Model([ast.unparse(b) for b in node.bases], fields, defaults)
    return models


@pytest.fixture(scope="module")
def vllm_models() -> dict[str, Model]:
    folder = packaged.vllm_sources("vllm-protocol", VLLM_VERSION, FILES)
    assert VLLM_VERSION in build_cache.build_info(folder)["wheel"]
    models: dict[str, Model] = {}
    for name in FILES:
        models.update(_read_models((folder / name).read_text()))
    return models


def fields(models: dict[str, Model], name: str) -> dict[str, bool]:
    """A model's fields with its bases' (those defined in the files read)."""
    model = models[name]
    out: dict[str, bool] = {}
    for base in model.bases:
        if base in models:
            out.update(fields(models, base))
    out.update(model.fields)
    return out


def check(models: dict[str, Model], name: str, obj: dict, where: str) -> None:
    known = fields(models, name)
    unknown = set(obj) - set(known)
    assert not unknown, f"{where}: {sorted(unknown)} are not fields of vLLM's {name}"
    missing = {k for k, required in known.items() if required} - set(obj)
    assert not missing, f"{where}: vLLM's {name} requires {sorted(missing)}"


def test_the_models_read_from_the_wheel_are_complete(vllm_models):
    # Guards the reader itself: a few fields and requirements known from vLLM's source.
    completion = fields(vllm_models, "CompletionRequest")
    assert {"prompt", "stop_token_ids", "return_token_ids", "skip_special_tokens", "logprobs"} <= set(completion)
    assert fields(vllm_models, "GenerateRequest")["token_ids"] is True  # required
    assert fields(vllm_models, "GenerateTokensStreamChoice")["index"] is True  # inherited from its base
    assert "speculative_decoding" in fields(vllm_models, "PerRequestMetrics")
    assert "_eos_token_id" not in fields(vllm_models, "SamplingParams")


# ---------------------------------------------------------------------------------------------
# What looptrace sends
# ---------------------------------------------------------------------------------------------


def sample_request() -> DecodeRequest:
    return DecodeRequest([1, 2, 3], 7, SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=5, presence_penalty=1.5),
                         frozenset({248046, 248044}), trace_headers={"traceparent": TRACEPARENT},
                         cache_salt="a-tenants-salt")


def test_completions_request_fields_are_vllms(vllm_models):
    body = protocol.completions_body("m", sample_request(), 7)
    check(vllm_models, "CompletionRequest", body, "/v1/completions body")
    check(vllm_models, "StreamOptions", body["stream_options"], "stream_options")
    assert body["prompt"] == [1, 2, 3] and body["stop_token_ids"] == [248044, 248046]
    assert (body["logprobs"], body["max_tokens"], body["seed"], body["top_k"]) == (5, 7, 5, 20)
    # The client's penalties go through; the settings it cannot set are sent as "off".
    assert (body["presence_penalty"], body["frequency_penalty"]) == (1.5, 0.0)
    assert body["return_tokens_as_token_ids"] is body["return_token_ids"] is body["stream"] is True
    assert body["skip_special_tokens"] is False
    assert body["cache_salt"] == "a-tenants-salt"  # top level on both routes (checked as vLLM's fields above)


def test_generate_request_fields_are_vllms(vllm_models):
    body = protocol.generate_body("m", sample_request(), 7)
    check(vllm_models, "GenerateRequest", body, "/inference/v1/generate body")
    check(vllm_models, "StreamOptions", body["stream_options"], "stream_options")
    sampling = body["sampling_params"]
    assert not set(sampling) - set(fields(vllm_models, "SamplingParams")), "sampling_params outside SamplingParams"
    assert (sampling["logprobs"], sampling["max_tokens"], sampling["temperature"]) == (5, 7, 0.7)
    assert (sampling["presence_penalty"], sampling["frequency_penalty"]) == (1.5, 0.0)
    assert body["output_mode"] == "tokens" and sampling["detokenize"] is False
    assert body["cache_salt"] == "a-tenants-salt"


def test_media_goes_where_vllms_serving_code_reads_it(vllm_models):
    request = sample_request()
    request.template_ids = [1, 9, 3]
    request.media_urls = [("image", "data:image/png;base64,AA=="), ("video", "data:video/mp4;base64,AA=="),
                          ("audio", "data:audio/wav;base64,AA==")]
    body = protocol.generate_body("m", request, 7)
    check(vllm_models, "GenerateRequest", body, "/inference/v1/generate body with media")
    assert body["token_ids"] == [1, 9, 3] and body["return_token_ids"] is True
    # The generate route's handler (serving.py) loops over request.content_parts, reading keys with
    # part.get(...) and comparing the type with constants: ours must be among them.
    source = (packaged.vllm_sources("vllm-protocol", VLLM_VERSION, FILES) / SERVING).read_text()
    loop = next(node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.For)
                and ast.unparse(node.iter) == "request.content_parts")
    keys = {call.args[0].value for call in ast.walk(loop) if isinstance(call, ast.Call)
            and ast.unparse(call.func) == "part.get" and isinstance(call.args[0], ast.Constant)}
    types = {c.value for node in ast.walk(loop) if isinstance(node, ast.Compare) and ast.unparse(node.left) == "ptype"
             for c in node.comparators if isinstance(c, ast.Constant)}
    assert {"type", "url"} <= keys and types == {"image_url", "audio_url", "video_url"}, (keys, types)
    for part in body["content_parts"]:
        assert set(part) <= keys and part["type"] in types, part


def test_neutral_settings_are_what_vllm_counts_as_off(vllm_models):
    # vLLM's own table of settings that change nothing, the ones it fills from generation_config.
    off = vllm_models["CompletionRequest"].defaults["_DEFAULT_SAMPLING_PARAMS"]
    sampling_defaults = vllm_models["SamplingParams"].defaults
    for key, value in protocol.NEUTRAL.items():
        assert off[key] == value, key
        assert sampling_defaults[key] == value, key
    # Every setting vLLM would take from the checkpoint is sent explicitly.
    sent = protocol.sampling_fields(sample_request(), 7)
    assert set(off) <= set(sent)


# ---------------------------------------------------------------------------------------------
# Both directions on the wire, through the double in --fast mode
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fast_double(tmp_path_factory):
    tokenizer_dir = tiny_qwen3_5.qwen3_5_tokenizer_dir()
    double = ChatDoubleProcess(tokenizer_dir, port=free_port(),
                               log_path=tmp_path_factory.mktemp("double") / "double.log", fast=True, api_key=KEY)
    try:
        double.wait_ready()
        yield double, tokenizer_dir
    finally:
        double.stop()


def raw_stream(double: DoubleProcess, path: str, body: dict) -> list[dict]:
    request = urllib.request.Request(double.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        text = response.read().decode()
    frames = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def raw_error(double: DoubleProcess, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(double.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    try:
        urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    raise AssertionError(f"{path} did not refuse {body}")


@pytest.mark.parametrize("scale_out, route", [("on", protocol.GENERATE), ("off", protocol.COMPLETIONS)])
def test_requests_on_the_wire_are_vllms(fast_double, vllm_models, scale_out, route):
    double, tokenizer_dir = fast_double
    double.reset()
    double.configure(scale_out=scale_out)
    from transformers import AutoTokenizer

    vocab = Vocabulary(AutoTokenizer.from_pretrained(tokenizer_dir))

    async def run():
        upstream = Upstream(double.url, KEY, timeout=30)
        try:
            await upstream.connect(None)
            events = [e async for e in VLLMBackend(Pool([upstream]), vocab).generate(sample_request())]
            return upstream.route, events
        finally:
            await upstream.close()

    try:
        used, events = asyncio.run(run())
    finally:
        double.configure(scale_out="on")
    assert used == route
    assert [e["type"] for e in events] == ["upstream", "prefill"] + ["token"] * 7 + ["done"]
    sent = [r for r in double.requests() if r["path"] == route and r["outcome"] == "done"]
    assert len(sent) == 1
    body = sent[0]["body"]
    build = protocol.generate_body if route == protocol.GENERATE else protocol.completions_body
    assert body == build(double.configure()["root"], sample_request(), 7)  # exactly what was checked above
    model = "GenerateRequest" if route == protocol.GENERATE else "CompletionRequest"
    check(vllm_models, model, body, f"{route} body as sent")
    _, trace, span, _ = TRACEPARENT.split("-")
    assert sent[0]["headers"] == {"authorization": f"Bearer {KEY}", "traceparent": TRACEPARENT,
                                  "x-request-id": f"{trace}-{span}"}


def test_completions_chunks_are_vllms(fast_double, vllm_models):
    double, _ = fast_double
    double.configure(spec_tokens=2)  # so that metrics.speculative_decoding is sent too
    try:
        chunks = raw_stream(double, protocol.COMPLETIONS, protocol.completions_body(
            double.configure()["root"], sample_request(), 7))
    finally:
        double.configure(spec_tokens=0)
    *tokens, last = chunks
    assert sum(len(c["choices"][0]["token_ids"]) for c in tokens) == 7
    assert any(len(c["choices"][0]["token_ids"]) > 1 for c in tokens), "speculative steps give several tokens"
    for i, chunk in enumerate(tokens):
        check(vllm_models, "CompletionStreamResponse", chunk, f"chunk {i}")
        for choice in chunk["choices"]:
            check(vllm_models, "CompletionResponseStreamChoice", choice, f"chunk {i} choice")
            check(vllm_models, "CompletionLogProbs", choice["logprobs"], f"chunk {i} logprobs")
            assert all(k.startswith("token_id:") for top in choice["logprobs"]["top_logprobs"] for k in top)
    assert tokens[0]["choices"][0]["prompt_token_ids"] == [1, 2, 3]
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    check(vllm_models, "CompletionStreamResponse", last, "usage chunk")
    assert last["choices"] == []
    check(vllm_models, "UsageInfo", last["usage"], "usage")
    check(vllm_models, "PromptTokenUsageInfo", last["usage"]["prompt_tokens_details"], "prompt_tokens_details")
    check(vllm_models, "PerRequestMetrics", last["metrics"], "metrics")
    check(vllm_models, "SpeculativeDecodingMetrics", last["metrics"]["speculative_decoding"], "speculative_decoding")


def test_generate_chunks_are_vllms(fast_double, vllm_models):
    double, _ = fast_double
    body = protocol.generate_body(double.configure()["root"], sample_request(), 7)
    chunks = raw_stream(double, protocol.GENERATE, body)
    *tokens, last = chunks
    assert sum(len(c["choices"][0]["token_ids"]) for c in tokens) == 7
    for i, chunk in enumerate(tokens):
        check(vllm_models, "GenerateTokensStreamResponse", chunk, f"chunk {i}")
        for choice in chunk["choices"]:
            check(vllm_models, "GenerateTokensStreamChoice", choice, f"chunk {i} choice")
            check(vllm_models, "GenerateLogProbs", choice["logprobs"], f"chunk {i} logprobs")
            for entry in choice["logprobs"]["content"]:
                check(vllm_models, "GenerateLogProbsContent", entry, f"chunk {i} logprob entry")
                for top in entry["top_logprobs"]:
                    check(vllm_models, "GenerateLogProb", top, f"chunk {i} top entry")
    check(vllm_models, "GenerateTokensStreamResponse", last, "usage chunk")
    check(vllm_models, "UsageInfo", last["usage"], "usage")


@pytest.mark.parametrize("include_usage", [True, False])
def test_chat_chunks_are_vllms(fast_double, vllm_models, include_usage):
    # The double's chat route is what LiteLLM's proxy and the relay benchmark's direct client call.
    double, tokenizer_dir = fast_double
    double.reset()
    body = {"model": double.configure()["root"], "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 7,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": include_usage},
            "chat_template_kwargs": {"enable_thinking": False}}
    check(vllm_models, "ChatCompletionRequest", body, "chat request")
    check(vllm_models, "StreamOptions", body["stream_options"], "stream_options")
    chunks = raw_stream(double, "/v1/chat/completions", body)
    for i, chunk in enumerate(chunks):
        check(vllm_models, "ChatCompletionStreamResponse", chunk, f"chunk {i}")
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"] == chunks[0]["id"]
        for choice in chunk["choices"]:
            check(vllm_models, "ChatCompletionResponseStreamChoice", choice, f"chunk {i} choice")
            check(vllm_models, "DeltaMessage", choice["delta"], f"chunk {i} delta")
    role, *tokens = chunks[:-1] if include_usage else chunks
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(tokens) == 7, "one chunk per token, as vLLM streams without a parser"
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 6 + ["length"]
    from transformers import AutoTokenizer

    sent = [r for r in double.requests() if r["path"] == "/v1/chat/completions" and r["outcome"] == "done"]
    assert len(sent) == 1 and len(sent[0]["token_ids"]) == 7
    text = AutoTokenizer.from_pretrained(tokenizer_dir).decode(sent[0]["token_ids"])
    assert "".join(c["choices"][0]["delta"]["content"] for c in tokens) == text
    if include_usage:
        last = chunks[-1]
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 7 and "system_fingerprint" in last
        check(vllm_models, "UsageInfo", last["usage"], "usage")
        assert "system_fingerprint" not in tokens[-1]
    else:
        assert "usage" not in tokens[-1] and "system_fingerprint" in tokens[-1]  # vLLM stamps the terminal chunk


def test_models_and_errors_are_vllms(fast_double, vllm_models):
    double, _ = fast_double
    request = urllib.request.Request(double.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        listing = json.loads(response.read())
    check(vllm_models, "ModelList", listing, "/v1/models")
    for card in listing["data"]:
        check(vllm_models, "ModelCard", card, "model card")
        for permission in card["permission"]:
            check(vllm_models, "ModelPermission", permission, "model permission")

    double.configure(max_model_len=2)
    try:
        status, body = raw_error(double, protocol.COMPLETIONS, protocol.completions_body(
            double.configure()["root"], sample_request(), 1))
    finally:
        double.configure(max_model_len=0)
    assert status == 400
    check(vllm_models, "ErrorResponse", body, "context refusal")
    check(vllm_models, "ErrorInfo", body["error"], "context refusal error")

    double.configure(scale_out="off")
    try:
        status, body = raw_error(double, protocol.GENERATE, {})
    finally:
        double.configure(scale_out="on")
    assert status == 403
    check(vllm_models, "ErrorInfo", body["error"], "scale-out refusal error")
    status, body = raw_error(double, protocol.GENERATE, {})  # the load-time probe: a validation error
    assert status == 400
    check(vllm_models, "ErrorInfo", body["error"], "validation error")
