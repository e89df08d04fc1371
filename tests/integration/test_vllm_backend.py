"""The vLLM backend over the vLLM test double (tests/support/vllm_double.py): the same events as local
decoding, both routes, trace context, speculative counts, and every failure as a clear error.

One double serves the module; two `looptrace serve --backend vllm` processes sit in front of it,
one loaded while the double had /inference/v1/generate and one while it refused it (403), so both
routes are exercised through the whole server.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.request

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoModelForCausalLM, AutoTokenizer

from looptrace.backends.base import DecodeRequest, SamplingParams
from looptrace.backends.local.backend import LocalBackend
from looptrace.backends.vllm import protocol as protocol
from looptrace.backends.vllm.backend import Pool, Upstream, VLLMBackend
from looptrace.common.vocabulary import Vocabulary
from looptrace.families import family_for_config

from server import Server, free_port, sse_events
from tiny_models import chat_prompt_ids
from vllm_double import DoubleProcess
from waiting import wait_until

KEY = "double-key"
TIMEOUT = 1.5  # --vllm-timeout of the servers under test: a stall must end in an error this fast
SLACK = 3.0  # what an error may take beyond the timeout (process scheduling on two busy cores)
NEW_TOKENS = 24
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
GREEDY = SamplingParams(temperature=0)
ROUTES = {"generate": protocol.GENERATE, "completions": protocol.COMPLETIONS}


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="module")
def double(qwen3_5_dir, logs):
    process = DoubleProcess(qwen3_5_dir, port=free_port(), log_path=logs / "double.log", api_key=KEY)
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture
def fresh(double, qwen3_5_dir):
    """The double as started: both routes, its full context, no switch armed, an empty request log."""
    double.configure(scale_out="on", max_model_len=0, spec_tokens=0, root=str(qwen3_5_dir))
    double.reset()
    return double


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen3_5_dir):
    return AutoTokenizer.from_pretrained(qwen3_5_dir)


@pytest.fixture(scope="module")
def local(qwen3_5_dir, qwen_tokenizer):
    tokenizer = qwen_tokenizer
    model = AutoModelForCausalLM.from_pretrained(qwen3_5_dir, dtype=torch.float32).eval()
    backend = LocalBackend(model, Vocabulary(tokenizer))
    yield tokenizer, backend
    asyncio.run(backend.close())


def collect(backend, request: DecodeRequest) -> list[dict]:
    async def run():
        return [event async for event in backend.generate(request)]

    return asyncio.run(run())


def through_vllm(double: DoubleProcess, vocab: Vocabulary, requests: list[DecodeRequest]) -> tuple[str, list]:
    """Events of each request from a VLLMBackend connected to the double, and the route it chose; the
    `upstream` event that starts each request (the only event local decoding lacks) checked and left out."""

    async def run():
        upstream = Upstream(double.url, KEY, timeout=60)
        try:
            await upstream.connect(None)
            backend = VLLMBackend(Pool([upstream]), vocab)
            return upstream.route, [[e async for e in backend.generate(r)] for r in requests]
        finally:
            await upstream.close()

    route, runs = asyncio.run(run())
    for events in runs:
        receipt = events[0]["receipt"]  # the only server: chosen as such, with what it is estimated to hold
        assert (receipt["policy"], receipt["reason"], receipt["index"]) == ("rendezvous", "only", "estimate")
        assert {k: v for k, v in events[0].items() if k != "receipt"} == {
            "type": "upstream", "server": f"127.0.0.1:{double.port}", "address": "127.0.0.1", "port": double.port,
            "route": route, "moved_from": None, "retry_after": None}
    return route, [events[1:] for events in runs]


def generations(double: DoubleProcess, route: str) -> list[dict]:
    """What the double received on `route`, less the load-time probe (no tokens: a body it refused)."""
    return [r for r in double.requests() if r["path"] == route and r["body"] and r["body"].get("token_ids") != []]


def tokens(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "token"]


# ---------------------------------------------------------------------------------------------
# The backend itself
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale_out, route", [("on", protocol.GENERATE), ("off", protocol.COMPLETIONS)])
def test_greedy_events_equal_the_local_backends(fresh, local, scale_out, route):
    tokenizer, local_backend = local
    prompt = chat_prompt_ids(tokenizer)
    free = collect(local_backend, DecodeRequest(prompt, NEW_TOKENS, GREEDY, frozenset()))
    ids = [t["id"] for t in tokens(free)]
    assert len(set(ids)) >= 8, "a degenerate tiny model would make equality prove little"
    stop_id = ids[9]
    stopped = collect(local_backend, DecodeRequest(prompt, NEW_TOKENS, GREEDY, frozenset({stop_id})))
    assert stopped[-1]["finish_reason"] == "stop" and tokens(stopped)[-1]["id"] == stop_id

    fresh.configure(scale_out=scale_out)
    used, (free_v, stopped_v) = through_vllm(fresh, local_backend.vocab, [
        DecodeRequest(prompt, NEW_TOKENS, GREEDY, frozenset()),
        DecodeRequest(prompt, NEW_TOKENS, GREEDY, frozenset({stop_id})),
    ])
    assert used == route
    for mine, theirs in ((free_v, free), (stopped_v, stopped)):
        assert [e["type"] for e in mine] == [e["type"] for e in theirs]
        assert mine[0]["prompt_tokens"] == theirs[0]["prompt_tokens"] == len(prompt)
        for a, b in zip(tokens(mine), tokens(theirs), strict=True):
            for key in ("index", "id", "piece", "text", "special", "rank", "top_ids"):
                assert a[key] == b[key], (key, a, b)
            assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)
            assert a["p"] == pytest.approx(b["p"], abs=1e-4)
            assert a["top_logprobs"] == pytest.approx(b["top_logprobs"], abs=1e-4)
        assert (mine[-1]["finish_reason"], mine[-1]["tokens"]) == (theirs[-1]["finish_reason"], theirs[-1]["tokens"])
    assert "".join(t["text"] for t in tokens(free_v)) == tokenizer.decode(ids)
    assert free_v[-1]["finish_reason"] == "length"
    # What the backend relayed is what the double generated.
    sent = [r["token_ids"] for r in generations(fresh, route)]
    assert sent == [ids, ids[:10]]


def test_traceparent_reaches_the_server_as_set(fresh, local):
    tokenizer, local_backend = local
    prompt = chat_prompt_ids(tokenizer)
    with_context = DecodeRequest(prompt, 2, GREEDY, frozenset(), trace_headers={"traceparent": TRACEPARENT})
    without = DecodeRequest(prompt, 2, GREEDY, frozenset())
    through_vllm(fresh, local_backend.vocab, [with_context, without])
    first, second = generations(fresh, protocol.GENERATE)
    # The request id a router's and the server's logs name it by is the decode span's.
    span = TRACEPARENT.split("-")
    assert first["headers"] == {"authorization": f"Bearer {KEY}", "traceparent": TRACEPARENT,
                                "x-request-id": f"{span[1]}-{span[2]}"}
    assert second["headers"] == {"authorization": f"Bearer {KEY}"}


def test_a_conversation_reaches_a_router_as_a_session_id(fresh, local):
    """X-Session-ID (vllm-router's consistent hash keys on it): a digest of the conversation, the same
    for each of its requests, another for another, and never the client's own words."""
    tokenizer, local_backend = local
    prompt = chat_prompt_ids(tokenizer)
    asked = [DecodeRequest(prompt, 2, GREEDY, frozenset(), conversation=c)
             for c in ("team-a/secret-session", "team-a/secret-session", "team-b/other")]
    through_vllm(fresh, local_backend.vocab, asked)
    sent = [r["headers"].get("x-session-id") for r in generations(fresh, protocol.GENERATE)]
    assert sent[0] == sent[1] != sent[2] and all(len(s) == 32 for s in sent)
    assert not any("secret" in s or "team" in s for s in sent)


def test_a_route_refused_after_the_probe_falls_back_for_the_request(fresh, local):
    """Behind a router the probe is answered by one server and a request by another: a request the
    generate route refuses (403: no --enable-scale-out) goes again by /v1/completions, answered whole,
    and the server's requests go that way from then on."""
    tokenizer, local_backend = local
    prompt = chat_prompt_ids(tokenizer)
    expected = collect(local_backend, DecodeRequest(prompt, NEW_TOKENS, GREEDY, frozenset()))

    async def run():
        upstream = Upstream(fresh.url, KEY, timeout=60)
        try:
            await upstream.connect(None)
            assert upstream.route == protocol.GENERATE  # the probe found the route
            fresh.configure(scale_out="off")  # ... which the server behind then refuses
            backend = VLLMBackend(Pool([upstream]), local_backend.vocab)
            runs = [[e async for e in backend.generate(DecodeRequest(prompt, NEW_TOKENS, GREEDY, frozenset()))]
                    for _ in range(2)]
            return upstream, runs
        finally:
            await upstream.close()

    upstream, runs = asyncio.run(run())
    for events in runs:
        assert [e["id"] for e in tokens(events)] == [e["id"] for e in tokens(expected)]
    assert upstream.route == protocol.COMPLETIONS and "403" in upstream.route_note
    # (The double records what it serves; the refusal is the route's, before any request is read.)
    assert [r["path"] for r in fresh.requests() if r["body"].get("token_ids") != []] == [protocol.COMPLETIONS] * 2


@pytest.mark.parametrize("scale_out", ["on", "off"])
def test_speculative_counts_and_cached_tokens_come_through(fresh, local, scale_out):
    tokenizer, local_backend = local
    # Long enough that a second run finds whole prefix-cache blocks.
    prompt = chat_prompt_ids(tokenizer) * 4
    expected = [t["id"] for t in tokens(collect(local_backend, DecodeRequest(prompt, NEW_TOKENS, GREEDY, frozenset())))]
    fresh.configure(scale_out=scale_out, spec_tokens=3)
    _, runs = through_vllm(fresh, local_backend.vocab, [DecodeRequest(prompt, NEW_TOKENS, GREEDY, frozenset())
                                                       for _ in range(2)])
    sent = [r for r in fresh.requests() if r["outcome"] == "done"]
    assert len(sent) == 2
    for events, record in zip(runs, sent):
        # Several tokens per chunk (accepted drafts) still come out one event each, in order.
        assert [t["id"] for t in tokens(events)] == expected
        spec = record["metrics"]["speculative_decoding"]
        done = events[-1]
        assert (done["drafts"], done["drafted"], done["accepted"]) == (
            spec["num_spec_steps"], spec["num_draft_tokens"], spec["num_accepted_draft_tokens"])
        assert 0 < done["accepted"] < done["drafted"]
        # vLLM says how many prompt tokens it had cached only at the end: the prefill event does not
        # guess, and `done` carries the number.
        assert events[0]["type"] == "prefill" and events[0]["cached_tokens"] is None
        assert done["cached_tokens"] == record["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert runs[0][-1]["cached_tokens"] == 0 and runs[1][-1]["cached_tokens"] >= 16


# ---------------------------------------------------------------------------------------------
# Through `looptrace serve --backend vllm`
# ---------------------------------------------------------------------------------------------


def vllm_server(double: DoubleProcess, logs, *args: str, wait: bool = True) -> Server:
    server = Server(*args, "--backend", "vllm", "--vllm-url", double.url + "/v1", "--vllm-api-key", KEY,
                    "--vllm-timeout", str(TIMEOUT), log_dir=logs)
    if wait:
        server.wait_ready()
    return server


@pytest.fixture(scope="module")
def servers(double, qwen3_5_dir, logs):
    """route → a looptrace process in front of the double: MODEL omitted for one, named for the other."""
    double.configure(scale_out="on")
    on_generate = vllm_server(double, logs)
    double.configure(scale_out="off")  # the second one's probe hears 403, as from a vLLM without --enable-scale-out
    try:
        on_completions = vllm_server(double, logs, str(qwen3_5_dir))
    finally:
        double.configure(scale_out="on")
    yield {"generate": on_generate, "completions": on_completions}
    on_generate.stop()
    on_completions.stop()


def test_health_names_the_route_and_the_server(servers, double, qwen3_5_dir):
    for name, server in servers.items():
        status, body = server.get("/health")
        assert status == 200
        assert (body["status"], body["backend"], body["model"]) == ("ready", "vllm", str(qwen3_5_dir))
        assert body["max_model_len"] == 262144  # the double's, from the checkpoint's config
        [upstream] = body["upstreams"]
        assert (upstream["url"], upstream["route"], upstream["reachable"], upstream["serving"]) == (
            double.url, ROUTES[name], True, True)
        assert upstream["server"] == f"127.0.0.1:{double.port}"
    assert "route_note" not in servers["generate"].get("/health")[1]["upstreams"][0]
    assert servers["completions"].get("/health")[1]["upstreams"][0]["route_note"] == (
        "/inference/v1/generate answered 403: the server was started without --enable-scale-out")


def test_cached_prompt_tokens_reach_the_prefill_span_and_the_metric(servers, fresh):
    """vLLM reports its prefix-cache hits at the end of a stream; the trace and the counter still get them."""
    server = servers["generate"]
    model = server.get("/health")[1]["model"]
    body = chat_body(model, stream=True)
    body["messages"][0]["content"] = "Tell me about lighthouses. " * 12  # several whole cache blocks
    before = cached_tokens_total(server, model)
    newest = server.newest_trace_id()
    assert raw_post(server, "/v1/chat/completions", body)[0] == 200
    first_trace = server.trace_after(newest)["trace_id"]
    assert raw_post(server, "/v1/chat/completions", body)[0] == 200
    sent = [r for r in generations(fresh, ROUTES["generate"])]
    hit = sent[1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert sent[0]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and hit >= 16
    trace = server.trace_after(first_trace)
    prefill = next(s for s in trace["spans"] if s["name"] == "prefill")
    assert prefill["attributes"]["looptrace.prefill.cached_tokens"] == hit
    root = next(s for s in trace["spans"] if s["parent_span_id"] is None)
    assert root["attributes"]["looptrace.usage.cached_tokens"] == hit
    assert cached_tokens_total(server, model) - before == hit


def cached_tokens_total(server: Server, model: str) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "looptrace_prompt_cached_tokens_total" and sample.labels.get("model") == model:
                return sample.value
    return 0.0


def chat_body(model: str, stream: bool, max_tokens: int = 12) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "chat_template_kwargs": {"enable_thinking": False}}


def responses_body(model: str, stream: bool, max_tokens: int = 12) -> dict:
    return {"model": model, "input": "What is the capital of France?", "max_output_tokens": max_tokens,
            "temperature": 0, "stream": stream, "reasoning": {"effort": "none"}}


@pytest.mark.parametrize("route", ["generate", "completions"])
def test_chat_relays_what_the_server_generated(servers, fresh, qwen3_5_dir, qwen_tokenizer, route):
    server = servers[route]
    model = server.get("/health")[1]["model"]
    status, whole = server.post("/v1/chat/completions", chat_body(model, stream=False))
    assert status == 200, whole
    streamed = raw_post(server, "/v1/chat/completions", chat_body(model, stream=True))
    assert streamed[0] == 200
    sent = generations(fresh, ROUTES[route])
    assert len(sent) == 2 and sent[0]["body"]["prompt" if route == "completions" else "token_ids"] == \
        sent[1]["body"]["prompt" if route == "completions" else "token_ids"]

    tokenizer = qwen_tokenizer
    messages = chat_body(model, False)["messages"]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False,
                                             tokenize=False)
    prompt = tokenizer.encode(rendered, add_special_tokens=False)
    body = sent[0]["body"]
    settings = body["sampling_params"] if route == "generate" else body
    assert (body["token_ids"] if route == "generate" else body["prompt"]) == prompt
    family = family_for_config(json.loads((qwen3_5_dir / "config.json").read_text()))(tokenizer)
    assert settings["stop_token_ids"] == sorted(family.stop_token_ids)
    assert (settings["max_tokens"], settings["temperature"], settings["logprobs"]) == (12, 0, 5)
    assert {k: settings[k] for k in protocol.NEUTRAL} == protocol.NEUTRAL
    assert settings["presence_penalty"] == settings["frequency_penalty"] == 0  # the client asked for none
    assert settings["skip_special_tokens"] is False

    ids = sent[0]["token_ids"]
    text = tokenizer.decode(ids, skip_special_tokens=False).lstrip()  # the parser drops whitespace opening a channel
    choice = whole["choices"][0]
    assert choice["message"]["content"] == text
    assert choice["finish_reason"] == "length" and len(ids) == 12
    assert whole["usage"]["prompt_tokens"] == len(prompt) and whole["usage"]["completion_tokens"] == 12
    deltas = [e["choices"][0]["delta"].get("content", "") for e in sse_events(streamed[1])
              if isinstance(e, dict) and e.get("choices")]
    assert "".join(deltas) == text and sent[1]["token_ids"] == ids


@pytest.mark.parametrize("route", ["generate", "completions"])
def test_each_step_keeps_the_weight_version_vllm_says_unless_the_client_says_it(servers, fresh, route):
    """Issue 44: vLLM 0.32 says which weights sampled an answer on the generate route's last chunk
    (`weight_versions`), and its current version at GET /weight_info (dev mode; its /v1/completions says none):
    the step keeps it and the export reads it; the client's X-Weight-Version still wins."""
    server = servers[route]
    model = server.get("/health")[1]["model"]
    version = f"step-7-{route}"
    fresh.update_weight_version(version)
    try:
        # The completions route learns it from /weight_info, read with each probe (every 5 s).
        wait_until(lambda: server.get("/health")[1]["upstreams"][0].get("weight_version") == version, 12, every=0.05)
        for header, expected, source in ((None, version, "vllm"), ("trainer-40", "trainer-40", "header")):
            newest = server.newest_trace_id()
            status, _ = server.post("/v1/chat/completions", chat_body(model, stream=False),
                                    headers={"X-Weight-Version": header} if header else {})
            assert status == 200
            spans = {s["name"]: s["attributes"] for s in server.trace_after(newest)["spans"]}
            request = next(a for a in spans.values() if "looptrace.endpoint" in a)
            assert (request["looptrace.weight_version"], request["looptrace.weight_version.source"]) == \
                (expected, source)
            assert spans["decode"]["looptrace.upstream.weight_version"] == version  # vLLM's own, kept beside
        assert len(generations(fresh, ROUTES[route])) == 2
    finally:
        fresh.update_weight_version("default")


def raw_post(server: Server, path: str, body: dict, timeout: float = 60) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def api_available(server: Server, api: str) -> bool:
    status, body = server.post(f"/v1/{api}", {})
    return not (status == 404 and body.get("error", {}).get("code") == "not_found")


# kind → (how to provoke it, tokens before the failure, HTTP status, message as a function of (url, prompt length,
# route))
FAILURES = {
    # vLLM refuses a prompt longer than its context on /v1/completions with a 400, and on the generate route
    # with a 200 whose stream is the same refusal (its engine checks there): the client's error either way.
    "refused with 400": ({"config": {"max_model_len": 8}}, 0, 400, lambda url, n, route: (
        f"This model's maximum context length is 8 tokens. However, your prompt contains {n} input tokens, which "
        f"exceeds this limit even without any output tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={n})" if route == "completions" else
        f"The decoder prompt (length {n}) is longer than the maximum model length of 8. Make sure that "
        f"`max_model_len` is no smaller than the number of text tokens plus multimodal tokens. For image inputs, "
        f"the number of image tokens depends on the number of images, and possibly their aspect ratios as well.")),
    "500": ({"arm": {"kind": "status", "status": 500, "message": "CUDA error: an illegal memory access"}}, 0, 502,
            lambda url, n, route: f"the vLLM server at {url} failed (500): CUDA error: an illegal memory access"),
    "cut before the first token": ({"arm": {"kind": "cut", "after": 0}}, 0, 502, lambda url, n, route: (
        f"the vLLM server at {url} cut the stream after 0 tokens: the connection closed before the response was "
        f"complete")),
    "cut mid-stream": ({"arm": {"kind": "cut", "after": 3}}, 3, 502, lambda url, n, route: (
        f"the vLLM server at {url} cut the stream after 3 tokens: the connection closed before the response was "
        f"complete")),
    "silent before the first token": ({"arm": {"kind": "stall", "after": 0}}, 0, 504, lambda url, n, route: (
        f"the vLLM server at {url} sent nothing for {TIMEOUT:g} s before the first token (--vllm-timeout)")),
    "silent mid-stream": ({"arm": {"kind": "stall", "after": 3}}, 3, 504, lambda url, n, route: (
        f"the vLLM server at {url} sent nothing for {TIMEOUT:g} s after token 3 (--vllm-timeout)")),
    "finish_reason abort": ({"arm": {"kind": "finish", "after": 3, "reason": "abort"}}, 3, 502, lambda url, n, route: (
        f"the vLLM server at {url} ended the generation with finish_reason 'abort' after 3 tokens")),
    "error frame": ({"arm": {"kind": "error_frame", "after": 3}}, 3, 502, lambda url, n, route: (
        f"the vLLM server at {url} failed after 3 tokens: Internal server error")),
    # A Chat Completions stream used to die without a word here (an AttributeError nobody caught).
    "malformed chunk": ({"arm": {"kind": "malformed", "after": 3}}, 3, 502, lambda url, n, route: (
        f"the vLLM server at {url} sent a chunk looptrace cannot read (not the shape of a vLLM completion chunk; "
        f"the server's log has the fault)")),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", ["chat/completions", "responses"])
@pytest.mark.parametrize("route", ["generate", "completions"])
@pytest.mark.parametrize("kind", list(FAILURES))
def test_each_failure_is_a_clear_error(servers, fresh, qwen_tokenizer, kind, route, api, stream):
    server = servers[route]
    if not api_available(server, api):
        pytest.skip(f"/v1/{api} is not served by this build")
    provoke, before, status, message = FAILURES[kind]
    if "config" in provoke:
        fresh.configure(**provoke["config"])
    if "arm" in provoke:
        fresh.arm(**provoke["arm"])
    model = server.get("/health")[1]["model"]
    body = (chat_body if api == "chat/completions" else responses_body)(model, stream)
    started = time.monotonic()
    got_status, raw = raw_post(server, f"/v1/{api}", body, timeout=TIMEOUT + 30)
    elapsed = time.monotonic() - started
    assert elapsed < TIMEOUT + SLACK, f"the error took {elapsed:.1f} s"

    record = generations(fresh, ROUTES[route])[-1]
    expected = message(fresh.url, len(record["body"]["token_ids" if route == "generate" else "prompt"]), route)
    if stream and before:
        assert got_status == 200  # the stream had begun: the error ends it
        events = sse_events(raw)
        if api == "chat/completions":
            assert events[-1] == "[DONE]"
            assert events[-2]["error"]["message"] == expected
            text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2] if e.get("choices"))
            sent_text = qwen_tokenizer.decode(record["token_ids"], skip_special_tokens=False).lstrip()
            assert text and sent_text.startswith(text), "the tokens before the failure reach the client"
        else:
            assert events[-1] == "[DONE]"  # the terminal frame of a Responses stream too (Open Responses)
            assert events[-2]["type"] == "response.failed"
            assert events[-2]["response"]["error"]["message"] == expected
    else:
        assert got_status == status, raw
        assert json.loads(raw)["error"]["message"] == expected
    assert len(record["token_ids"]) == before
    if kind.startswith("silent"):
        # Giving up closed the upstream connection, which is how vLLM stops generating.
        wait_until(lambda: fresh.requests()[-1]["outcome"] == "cancelled", 5, every=0.05,
                   what=lambda: f"the upstream request cancelled: {fresh.requests()[-1]}")


@pytest.mark.parametrize("api", ["chat/completions", "responses"])
def test_a_client_that_leaves_stops_the_servers_generation(servers, fresh, api):
    server = servers["generate"]
    if not api_available(server, api):
        pytest.skip(f"/v1/{api} is not served by this build")
    fresh.arm(kind="delay", seconds=0.2)
    model = server.get("/health")[1]["model"]
    body = (chat_body if api == "chat/completions" else responses_body)(model, True, max_tokens=60)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("POST", f"/v1/{api}", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    seen = b""
    while b"delta" not in seen:  # the first text has come through
        seen += response.read1(4096)
    connection.sock.close()
    connection.close()
    wait_until(lambda: fresh.requests()[-1]["outcome"] == "cancelled", 5, every=0.05,
               what=lambda: f"the upstream request cancelled: {fresh.requests()[-1]}")
    assert 1 <= len(fresh.requests()[-1]["token_ids"]) < 30


# ---------------------------------------------------------------------------------------------
# Loading against a server that is not (yet) there, or serves something else
# ---------------------------------------------------------------------------------------------


def test_a_folder_the_server_read_but_this_machine_lacks_is_refused(fresh, logs, qwen3_5_dir):
    fresh.configure(root="/srv/models/Qwen3.5-0.8B")
    server = vllm_server(fresh, logs, wait=False)
    try:
        wait_until(lambda: server.get("/health")[1].get("status") == "failed", 60, every=0.05,
                   what=lambda: f"/health saying failed:\n{server.log()}")
        status, body = server.get("/health")
        assert status == 503
        assert body["reason"] == (
            f"FileNotFoundError: the vLLM server at {fresh.url} loaded {qwen3_5_dir} "
            f"from /srv/models/Qwen3.5-0.8B, which is not on this machine: looptrace reads the tokenizer and chat "
            f"template from the same checkpoint, so that folder must be at the same path here (copy or mount it), "
            f"or named with --tokenizer PATH, or the server must be started from a Hub id")
    finally:
        server.stop()


def test_tokenizer_names_where_the_servers_folder_is_here(fresh, logs, qwen3_5_dir):
    fresh.configure(root="/srv/models/Qwen3.5-0.8B")
    server = vllm_server(fresh, logs, "--tokenizer", str(qwen3_5_dir))
    try:
        assert server.get("/health")[1]["status"] == "ready"
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
        status, answer = server.post("/v1/chat/completions", {"model": str(qwen3_5_dir), **body})
        assert status == 200, answer
        # The name is still the one the server serves, and checked against it.
        assert server.post("/v1/chat/completions", {"model": "/srv/models/Qwen3.5-0.8B", **body})[0] == 404
    finally:
        server.stop()


def test_a_model_the_server_does_not_serve_is_refused(fresh, logs, qwen3_5_dir):
    server = vllm_server(fresh, logs, "Qwen/Qwen3.5-27B", wait=False)
    try:
        wait_until(lambda: server.get("/health")[1].get("status") == "failed", 60, every=0.05,
                   what=lambda: f"/health saying failed:\n{server.log()}")
        reason = server.get("/health")[1]["reason"]
        assert reason == (f"RuntimeError: the vLLM server at {fresh.url} serves {qwen3_5_dir} (from {qwen3_5_dir}), "
                          f"not Qwen/Qwen3.5-27B: name one of those, or leave MODEL out to use what it serves")
    finally:
        server.stop()


def test_an_unreachable_server_is_reported_and_retried(qwen3_5_dir, logs):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # A generous --vllm-timeout: this test is about retrying, and a freshly started double's first answer
    # can take seconds on a loaded machine (a 504 at 1.5 s failed it in CI).
    server = Server("--backend", "vllm", "--vllm-url", url, "--vllm-timeout", "30", log_dir=logs)
    late = None
    try:
        refused = f"cannot reach the vLLM server at {url}: connection refused; retrying every 5 s"
        wait_until(lambda: server.get("/health")[1].get("reason") == refused, 60, every=0.05,
                   what=lambda: f"/health saying {refused}:\n{server.log()}")
        status, body = server.get("/health")
        assert (status, body["status"], body["upstreams"][0]["reachable"]) == (503, "loading", False)
        for api, make in (("chat/completions", chat_body), ("responses", responses_body)):
            started = time.monotonic()
            status, answer = server.post(f"/v1/{api}", make("any", stream=False))
            if status == 404 and api == "responses":
                continue  # this build has no Responses API
            assert (status, answer["error"]["message"]) == (503, f"the model is not ready: {refused}")
            assert time.monotonic() - started < 1.0  # answered at once, not held until the server appears

        late = DoubleProcess(qwen3_5_dir, port=port, log_path=logs / "late-double.log")
        late.wait_ready()
        server.wait_ready(timeout=60)  # the background retries found it
        model = server.get("/health")[1]["model"]
        status, answer = server.post("/v1/chat/completions", chat_body(model, stream=False, max_tokens=3))
        assert status == 200 and answer["usage"]["completion_tokens"] == 3

        late.stop()
        late = None
        gone = f"cannot reach the vLLM server at {url}: connection refused"
        for api, make in (("chat/completions", chat_body), ("responses", responses_body)):
            for stream in (False, True):
                status, raw = raw_post(server, f"/v1/{api}", make(model, stream=stream))
                if status == 404 and api == "responses":
                    continue  # this build has no Responses API
                assert (status, json.loads(raw)["error"]["message"]) == (502, gone)
        status, body = server.get("/health")
        [upstream] = body["upstreams"]
        assert (status, body["status"], upstream["reachable"], upstream["error"]) == (
            503, "upstream_unreachable", False, gone)
    finally:
        if late is not None:
            late.stop()
        server.stop()


# ---------------------------------------------------------------------------------------------
# A real model's tokenizer and template, end to end with the openai SDK
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_gguf_path, logs):
    """A double decoding SmolLM2-135M-Instruct (GGUF), and looptrace in front of it with MODEL left out."""
    double = DoubleProcess(smollm2_gguf_path, port=free_port(), log_path=logs / "smollm2-double.log")
    server = None
    try:
        double.wait_ready()
        # The default --vllm-timeout: a real model on two busy cores may take more than TIMEOUT for a token.
        server = Server("--backend", "vllm", "--vllm-url", double.url, log_dir=logs)
        server.wait_ready()
        yield double, server
    finally:
        if server is not None:
            server.stop()
        double.stop()


def test_openai_sdk_chat_through_vllm_with_smollm2(smollm2_pair, smollm2_gguf_path):
    from openai import OpenAI

    double, server = smollm2_pair
    client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    assert model == str(smollm2_gguf_path)  # what the server serves, MODEL having been left out
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=32, temperature=0)
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=32, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    sent = generations(double, protocol.GENERATE)
    assert len(sent) == 2 and sent[0]["token_ids"] == sent[1]["token_ids"]
    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf_path.parent, gguf_file=smollm2_gguf_path.name)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert sent[0]["body"]["token_ids"] == list(prompt["input_ids"])  # rendered and tokenized here, sent as ids
    ids = sent[0]["token_ids"]
    stopped = ids[-1] in sent[0]["body"]["sampling_params"]["stop_token_ids"]
    text = tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False)
    answer = whole.choices[0].message.content
    assert answer == text and streamed == text
    assert "Paris" in answer  # the real model, greedy, knows
    assert whole.choices[0].finish_reason == ("stop" if stopped else "length")
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(sent[0]["body"]["token_ids"]), len(ids))
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens)


@pytest.mark.parametrize("route", ["generate", "completions"])
def test_a_fork_runs_on_the_vllm_server_like_local_decoding(servers, fresh, local, route):
    """POST /v1/traces/{id}/fork through `--backend vllm`: the stored prompt, the kept tokens and the
    replacement go to the server as token ids, and its greedy continuation is what local decoding gives."""
    tokenizer, local_backend = local
    server = servers[route]
    model = server.get("/health")[1]["model"]
    before = server.newest_trace_id()
    status, _ = server.post("/v1/chat/completions", chat_body(model, stream=False, max_tokens=12))
    assert status == 200
    trace = server.trace_after(before)
    prompt = next(s for s in trace["spans"] if s["name"] == "render")["attributes"]["looptrace.prompt.ids"]
    generated = server.get(f"/v1/traces/{trace['trace_id']}/tokens")[1]["tokens"]
    alternative = next(i for i in generated[2]["top_ids"] if i != generated[2]["id"])
    status, fork = server.post(f"/v1/traces/{trace['trace_id']}/fork", {"index": 2, "token_id": alternative})
    assert status == 200, fork
    prefix = fork["looptrace"]["prefix_ids"]
    assert prefix == [t["id"] for t in generated[:2]] + [alternative]
    sent = generations(fresh, ROUTES[route])[-1]
    assert (sent["body"]["token_ids"] if route == "generate" else sent["body"]["prompt"]) == prompt + prefix
    stop = frozenset(tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    expected = tokens(collect(local_backend, DecodeRequest(prompt + prefix, 12 - 3, GREEDY, stop)))
    assert [t["id"] for t in fork["looptrace"]["tokens"]] == [t["id"] for t in expected]
