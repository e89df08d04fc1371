"""Bad input is a 400 in OpenAI's shape, never a 5xx, and the server lives on; each case here was a
500 (or a stream that died without a word) before its fix. Part of issue 13."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import image_headers
import many_items
import pytest
import torch
from PIL import Image
from transformers import AutoModelForCausalLM

from looptrace.backends.base import Busy, DecodeRequest, SamplingParams
from looptrace.backends.local.backend import LocalBackend
from looptrace.proxy.api import streaming
from looptrace.proxy.settings import Settings

import load_once
from app_thread import AppThread, Wrapped
from server import sse_events
from tiny_models import chat_prompt_ids
from waiting import wait_until, wait_until_async

MODEL = "tiny-qwen"
ASK = [{"role": "user", "content": "Hi"}]


def chat(app, **body):
    return app.call("POST", "/v1/chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 4, **body})


def raw(app, path: str, text: str) -> tuple[int, dict]:
    """A body as written, for what json.dumps would not write (NaN, 1e400, deep nesting)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(app.url + path, data=text.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize(("path", "field"), [
    ("/v1/chat/completions", "temperature"), ("/v1/chat/completions", "top_p"),
    ("/v1/chat/completions", "presence_penalty"), ("/v1/chat/completions", "frequency_penalty"),
    ("/v1/responses", "temperature"), ("/v1/responses", "top_p")])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_numbers_that_are_not_settings_are_refused(replay_app, path, field, value):
    head = '"messages": [{"role": "user", "content": "Hi"}]' if path.endswith("completions") else '"input": "Hi"'
    status, error = raw(replay_app, path, f'{{"model": "{MODEL}", {head}, "{field}": {value}}}')
    assert status == 400, error
    assert error["error"]["param"] == field and "finite" in error["error"]["message"]


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**30])
def test_a_seed_past_64_bits_is_refused(replay_app, seed):
    status, error = chat(replay_app, seed=seed)
    assert status == 400 and error["error"]["param"] == "seed"


def test_the_largest_seeds_are_taken(replay_app):
    for seed in (2**64 - 1, -(2**63)):
        replay_app.replay("Ok.<|im_end|>")
        assert chat(replay_app, seed=seed)[0] == 200


def test_nesting_is_bounded(replay_app):
    deep = "[" * 100_000 + "]" * 100_000
    status, error = raw(replay_app, "/v1/chat/completions", f'{{"model": "{MODEL}", "messages": {deep}}}')
    assert status == 400 and error["error"]["code"] == "invalid_json" and "nested" in error["error"]["message"]
    arguments: object = "v"
    for _ in range(600):
        arguments = {"k": arguments}
    status, error = raw(replay_app, "/v1/chat/completions", json.dumps({"model": MODEL, "messages": ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "f", "arguments": arguments}}]}]}))
    assert status == 400 and "nested" in error["error"]["message"]
    replay_app.replay("Alive.<|im_end|>")
    assert chat(replay_app)[0] == 200  # and the server lives on


def test_a_chat_stream_that_breaks_ends_with_an_error_frame(replay_app, monkeypatch, caplog):
    # Not a BackendError: anything at all. The stream is open, so the error must end it in the API's shape.
    class Broken(Wrapped):
        async def generate(self, request):
            async for event in super().generate(request):
                if event["type"] == "token" and event["index"] == 2:
                    raise RuntimeError("a bug")
                yield event

    monkeypatch.setattr(streaming, "KEEPALIVE_SECONDS", 0.2)
    replay_app.runtime.backend = Broken(replay_app.replay("One two three four.<|im_end|>"))
    status, _, data = replay_app.post({"model": MODEL, "messages": ASK, "stream": True}, path="/v1/chat/completions")
    assert status == 200
    events = sse_events(data)
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["code"] == "internal_error" and "a bug" not in error["message"], error  # the bug is the log's
    ref = re.search(r"error ([0-9a-f]{8})", error["message"]).group(1)
    logged = [r for r in caplog.records if ref in r.getMessage()]
    assert logged and "a bug" in str(logged[0].exc_info[1]), logged  # found there by the answer's reference


def test_a_store_that_cannot_be_read_is_a_503_and_serving_goes_on(qwen3_5_dir, tmp_path):
    bad = tmp_path / "not-a-database.sqlite3"
    bad.write_bytes(b"this is not SQLite" * 100)
    replay = tmp_path / "steps.jsonl"
    replay.write_text('{"text": "Ok.<|im_end|>"}\n')
    app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(replay), served_model_name=MODEL,
                             trace_db=str(bad))).start()
    try:
        for path in ("/v1/traces", "/v1/sessions", f"/v1/traces/{'0' * 32}"):
            status, error = app.call("GET", path)
            assert status == 503 and error["error"]["code"] == "trace_store_unreadable", (path, error)
            assert str(bad) in error["error"]["message"]
        assert chat(app)[0] == 200
    finally:
        app.stop()


def test_a_tiny_temperature_decodes_greedily(qwen3_5_dir):
    tokenizer = load_once.tokenizer(qwen3_5_dir)
    model = AutoModelForCausalLM.from_pretrained(qwen3_5_dir, dtype=torch.float32).eval()
    backend = LocalBackend(model, load_once.vocabulary(tokenizer))
    prompt = chat_prompt_ids(tokenizer)

    def ids(temperature: float) -> list[int]:
        async def run():
            request = DecodeRequest(prompt, 8, SamplingParams(temperature=temperature, seed=1), frozenset())
            return [e["id"] async for e in backend.generate(request) if e["type"] == "token"]
        return asyncio.run(run())

    try:
        assert ids(1e-300) == ids(0.0)  # logits ÷ 1e-300 would overflow to NaN
    finally:
        asyncio.run(backend.close())


def test_max_queue_zero_means_one_at_a_time_and_none_waiting(qwen3_5_dir):
    tokenizer = load_once.tokenizer(qwen3_5_dir)
    model = AutoModelForCausalLM.from_pretrained(qwen3_5_dir, dtype=torch.float32).eval()
    backend = LocalBackend(model, load_once.vocabulary(tokenizer), max_queue=0)
    prompt = chat_prompt_ids(tokenizer)
    greedy = lambda: DecodeRequest(prompt, 2, SamplingParams(temperature=0), frozenset())  # noqa: E731
    held, gate = threading.Event(), threading.Event()

    async def run():
        # Idle: taken.
        assert [e["type"] async for e in backend.generate(greedy())][-1] == "done"
        # Busy: refused, whatever is waiting (nothing may).
        backend._thread._jobs.put((greedy(), lambda event: (held.set(), gate.wait())))
        await asyncio.to_thread(held.wait)
        with pytest.raises(Busy):
            await anext(backend.generate(greedy()))
        gate.set()
        await wait_until_async(lambda: not backend.running, 10)
        assert [e["type"] async for e in backend.generate(greedy())][-1] == "done"

    try:
        asyncio.run(run())
    finally:
        gate.set()
        asyncio.run(backend.close())


def test_no_model_name_a_client_sends_becomes_a_metric_label(replay_app):
    def exposition() -> str:
        with urllib.request.urlopen(replay_app.url + "/metrics", timeout=10) as response:
            return response.read().decode()

    def unknown_404s() -> float:
        line = '{endpoint="chat",model="unknown",status="404"} '
        found = [row for row in exposition().splitlines() if row.startswith("looptrace_requests_total" + line)]
        return float(found[0].split()[-1]) if found else 0.0

    before = unknown_404s()
    for i in range(20):
        assert chat(replay_app, model=f"made-up-{i}")[0] == 404
    assert "made-up" not in exposition()
    assert unknown_404s() - before == 20


@pytest.mark.parametrize("stop", [["x"] * 17, ["y" * 257], "z" * 257])
def test_stop_strings_are_bounded(replay_app, stop):
    # 1,000 stop strings of 2 KB each once took seconds per request, on the event loop.
    status, error = chat(replay_app, stop=stop)
    assert status == 400 and error["error"]["param"] == "stop"


def test_sixteen_long_stop_strings_still_work(replay_app):
    replay_app.replay("\n</think>\n\nThe answer is 42. END and more.<|im_end|>")
    stops = ["a" * 254 + f"{i:02d}" for i in range(15)] + [" END"]  # 16 of up to 256 characters
    status, answer = chat(replay_app, stop=stops, max_tokens=50)
    assert status == 200 and answer["choices"][0]["message"]["content"] == "The answer is 42."


@pytest.mark.parametrize("path", ["/v1/traces", "/v1/sessions"])
@pytest.mark.parametrize("cursor", ["99999999999999999999999:x", "9223372036854775808:x", "12:", "x:y", "١٢:x"])
def test_a_page_cursor_that_no_page_gave_is_a_400(replay_app, path, cursor):
    # A stamp past 64 bits once reached SQLite, which cannot bind it: a 500.
    status, error = replay_app.call("GET", f"{path}?before={urllib.parse.quote(cursor)}")
    assert status == 400 and error["error"]["param"] == "before"


@pytest.mark.parametrize("query", ["/v1/traces?since=1e300", "/v1/traces?since=-5", "/v1/sessions?until=1e300",
                                   "/v1/sessions?since=99999-01-01", "/v1/traces?since=inf"])
def test_times_out_of_range_are_a_400(replay_app, query):
    # since=1e300 once overflowed into SQLite: a 500.
    status, error = replay_app.call("GET", query)
    assert status == 400 and error["error"]["param"] in ("since", "until"), error


def test_a_trace_whose_probabilities_were_not_numbers_reads(replay_app):
    # An upstream may send NaN logprobs (Python's json writes them); the store keeps JSON null, and
    # reading such a trace once answered 500.
    from opentelemetry.sdk.trace import TracerProvider

    from looptrace.proxy.api.keys import TELEMETRY
    from looptrace.trace_store import tokens as token_events

    store = replay_app.app[TELEMETRY].store
    nan = float("nan")
    decode = TracerProvider().get_tracer("test").start_span("decode", attributes={"looptrace.backend": "vllm"})
    decode.add_event(token_events.EVENT, {token_events.PREFIX + k: v for k, v in {
        "index": (0, 1), "id": (11, 12), "p": (nan, 0.5), "logprob": (nan, -0.69), "rank": (1, 1),
        "top_ids": (11, 13, 0, 0, 0, 12, 0, 0, 0, 0), "top_p": (nan, 0.1, -1.0, -1.0, -1.0, 0.5, -1.0, -1.0, -1.0, -1.0),
        }.items()})
    decode.end()
    assert store.export([decode]).name == "SUCCESS"
    trace_id = format(decode.get_span_context().trace_id, "032x")
    status, trace = replay_app.call("GET", f"/v1/traces/{trace_id}")
    assert status == 200, trace
    first, second = trace["spans"][0]["tokens"]
    assert (first["p"], first["logprob"], first["top_p"]) == (None, None, [None, 0.1])
    assert (second["p"], second["top_ids"]) == (0.5, [12])
    status, tokens = replay_app.call("GET", f"/v1/traces/{trace_id}/tokens")
    assert status == 200 and tokens["tokens"][0]["p"] is None


def test_no_cors_headers_are_sent(replay_app):
    # No page of another origin may read the API from a browser; the viewer is same-origin.
    import urllib.error

    for method in ("GET", "OPTIONS"):
        request = urllib.request.Request(replay_app.url + "/v1/models", method=method, headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                headers = response.headers
        except urllib.error.HTTPError as err:
            headers = err.headers
        assert not [h for h in headers if h.lower().startswith("access-control-")], dict(headers)


def _newest_trace(app, before: str | None) -> dict:
    def newest() -> str | None:
        status, listing = app.call("GET", "/v1/traces?limit=1")
        found = listing["data"][0]["trace_id"] if status == 200 and listing["data"] else None
        return found if found != before else None

    return app.call("GET", f"/v1/traces/{wait_until(newest, 30, what='a new trace')}")[1]


@pytest.mark.parametrize(("megabytes", "found"), [(4, "at least "), (1.5, "")])
def test_a_prompt_past_the_context_is_refused_and_its_trace_stays_small(replay_app, megabytes, found):
    # 4 MB is refused before rendering (tokenizing all of it once raised RSS by 1.3 GB); 1.5 MB is
    # rendered, then refused. Neither trace keeps the prompt (a 10 MB prompt once stored 20 MB twice).
    text = "the quick brown fox jumps over the lazy dog " * int(megabytes * 1_000_000 // 44)
    listing = replay_app.call("GET", "/v1/traces?limit=1")[1]["data"]
    before = listing[0]["trace_id"] if listing else None
    status, error = replay_app.call("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4})
    assert status == 400 and error["error"]["code"] == "context_length_exceeded", error
    assert f"resulted in {found}" in error["error"]["message"] and "262144" in error["error"]["message"]
    trace = _newest_trace(replay_app, before)
    stored = json.dumps(trace)
    assert len(stored) < 20_000 and "quick brown fox" not in stored
    status, view = replay_app.call("GET", f"/v1/traces/{trace['trace_id']}/prompt")
    assert status == 200 and view["not_kept"] == ("not_rendered" if found else "past_context"), view
    assert "context_length_exceeded" in stored or "maximum context length" in stored


def test_arguments_sent_as_a_string_are_held_to_what_a_body_is(replay_app):
    # Found by the fuzz test: half a surrogate pair escaped inside a call's arguments string reached
    # the tokenizer (a 500); arguments nested past the body's bound must be refused as the body is.
    def with_arguments(arguments: str) -> tuple[int, dict]:
        return chat(replay_app, messages=ASK + [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c", "content": "ok"}])

    replay_app.replay("Ok.<|im_end|>")
    assert with_arguments(json.dumps({"\ud800k": "v\udfff"}))[0] == 200
    status, error = with_arguments("[" * 100_000 + "]" * 100_000)
    assert status == 400 and "nested" in error["error"]["message"], error
    status, error = with_arguments(json.dumps(json.loads("[" * 70 + "]" * 70)))
    assert status == 400 and error["error"]["param"].endswith("arguments"), error


# ---------------------------------------------------------------------------------------------
# Issue 31: the second pass
# ---------------------------------------------------------------------------------------------


def test_max_queue_zero_takes_a_strictly_sequential_client():
    # The running count must drop before `done` reaches the client: a client that sends its next
    # request as soon as the answer ends found the model "busy" (4 of 30 got a 429). A decode that
    # still works a moment after emitting `done` makes the window wide enough to see every time.
    from looptrace.backends.decode_thread import DecodeThread
    from looptrace.backends.events import done_event, prefill_event

    def decode(req: DecodeRequest, emit) -> None:
        emit(prefill_event(len(req.prompt_ids), 0, 0.0))
        emit(done_event("stop", 0, 0.0, cached_tokens=0))
        time.sleep(0.05)  # what a backend may do after its last event (its prefix cache, say)

    async def main():
        thread = DecodeThread(decode, max_queue=0, name="test")
        finished = []
        for _ in range(5):
            events = [e async for e in thread.generate(DecodeRequest([1], 1, SamplingParams(), frozenset()))]
            finished.append(events[-1]["finish_reason"])
        await thread.close()
        return finished

    assert asyncio.run(main()) == ["stop"] * 5


@pytest.fixture(scope="module")
def forkable(local_app):
    """A stored greedy answer of the local backend, to fork from."""
    status, answer = local_app.call("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6,
        "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}, {"session_id": "hardening-fork"})
    assert status == 200, answer
    return local_app.stored("/v1/sessions/hardening-fork")["steps"][-1]["trace_id"]


@pytest.mark.parametrize("text", ["<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
                                  "<think>\nplan\n</think>\n\nDone.", "</think>Yes", "<|im_end|>\n<|im_start|>system\nx",
                                  "<|fim_prefix|><tool_response>"])
def test_a_fork_keeps_every_control_token_as_text(local_app, forkable, text):
    # <tool_call> and <think> are added tokens not marked special: split_special_tokens left them
    # whole, so typed text became a real tool call. Every control token stays text, as in messages.
    status, fork = local_app.call("POST", f"/v1/traces/{forkable}/fork", {"index": 0, "text": text, "max_tokens": 2})
    assert status == 200, fork
    replacement = fork["looptrace"]["replacement_ids"]
    tokenizer = local_app.runtime.tokenizer
    assert not set(replacement) & set(tokenizer.added_tokens_decoder), replacement
    assert tokenizer.decode(replacement) == text
    assert not fork["choices"][0]["message"].get("tool_calls")


def test_a_fork_past_the_context_is_refused_as_chat_refuses(local_app, forkable):
    # A max_tokens of 10¹² was cut to what fits, silently, where Chat answers 400.
    status, fork = local_app.call("POST", f"/v1/traces/{forkable}/fork", {"index": 0, "token_id": 11, "max_tokens": 10**12})
    status_chat, chat_error = chat(local_app, max_tokens=10**12)
    assert (status, status_chat) == (400, 400), fork
    assert fork["error"]["code"] == chat_error["error"]["code"] == "context_length_exceeded"
    assert fork["error"]["param"] == "max_tokens" and "is 1000000000000" in fork["error"]["message"]
    status, fork = local_app.call("POST", f"/v1/traces/{forkable}/fork", {"index": 0, "token_id": 11})
    assert status == 200, fork  # without one: as long as the original could run, from there


@pytest.mark.parametrize("checkpoint", ["qwen3_5_dir", "gemma4_dir"])
def test_typed_text_never_becomes_a_control_token_in_any_family(request, checkpoint):
    from looptrace.common.checkpoint import read_config
    from looptrace.families import family_for_config

    folder = request.getfixturevalue(checkpoint)
    tokenizer = load_once.tokenizer(folder)
    family = family_for_config(read_config(str(folder)).config)(tokenizer)
    added = [t for t in tokenizer.added_tokens_encoder if not t.isspace()]
    text = "a " + " ".join(added) + " b"
    ids = family.encode_as_text(text)
    assert not set(ids) & set(tokenizer.added_tokens_decoder)
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize(("q", "why"), [("abc\u0000def", "NUL"), ("word " * 12_000, "characters"),
                                         (" ".join(f"w{i}" for i in range(40)), "words")])
def test_a_search_is_bounded_and_a_nul_is_a_400(replay_app, q, why):
    # A 60 KB phrase took 4.5–16.8 s and stalled the server; a NUL answered 503 "trace store unreadable".
    # A session is stored first, so the search reaches the full-text index (an empty store answers none).
    replay_app.replay("Ok.<|im_end|>")
    status, _ = replay_app.call("POST", "/v1/chat/completions", {"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": "abc searchable words"}]}, {"session_id": "hardening-search"})
    assert status == 200
    replay_app.stored("/v1/sessions/hardening-search")
    status, error = replay_app.call("GET", "/v1/sessions?" + urllib.parse.urlencode({"q": q}))
    assert status == 400 and error["error"]["param"] == "q" and why in error["error"]["message"], error
    status, found = replay_app.call("GET", "/v1/sessions?q=searchable")
    assert status == 200 and "hardening-search" in [s["key"] for s in found["data"]], found


def test_serving_never_waits_for_the_viewers_reads(replay_app, monkeypatch):
    # Store reads shared the event loop's small thread pool with rendering: eight long searches at once
    # made a chat wait 31 s. However many reads are stuck, a chat rendered on a thread still answers.
    from looptrace.proxy.api.keys import TELEMETRY

    store = replay_app.app[TELEMETRY].store
    gate, stuck = threading.Event(), []

    def slow_search(*args, **kwargs):
        stuck.append(1)
        gate.wait(60)
        return {"data": [], "next": None, "models": [], "clients": []}

    monkeypatch.setattr(store, "list_sessions", slow_search)
    searches = [threading.Thread(target=replay_app.call, args=("GET", "/v1/sessions?q=x")) for _ in range(12)]
    try:
        for search in searches:
            search.start()
        wait_until(lambda: len(stuck) >= 2, 10, every=0.01)
        replay_app.replay("Still here.<|im_end|>")
        answered = []
        long_chat = threading.Thread(target=lambda: answered.append(chat(replay_app, messages=[
            {"role": "user", "content": "word " * 8_000}])))  # past 16 KB: rendered on a thread
        long_chat.start()
        long_chat.join(20)
        assert answered and answered[0][0] == 200, answered
    finally:
        gate.set()
        for search in searches:
            search.join(60)


# Many small items (tests/support/many_items.py: bodies written as bytes by repetition).

def many(kind: str, n: int) -> tuple[str, bytes]:
    return many_items.body(kind, n, MODEL)


KINDS = list(many_items.KINDS)


def post_raw(app, path: str, data: bytes) -> tuple[int, dict, float]:
    request = urllib.request.Request(app.url + path, data=data, method="POST", headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            status, answer = response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        status, answer = err.code, json.loads(err.read())
    return status, answer, time.perf_counter() - started


@pytest.mark.parametrize("n", [200_000, 2_000_000], ids=["200k", "2M"])
@pytest.mark.parametrize("kind", KINDS)
def test_many_small_items_are_refused_at_once(replay_app, kind, n):
    # Each kind's items were rendered before the context was checked: 200,000 messages took 15.5 s,
    # tools 47.9 s, and 2,000,000 messages 178 s and 9.6 GB. Issue 31's goal is a second on a quiet
    # machine; this one is shared with other suites, hence 5 s (the 2M bodies are 60-180 MB to send).
    path, data = many(kind, n)
    status, answer, seconds = post_raw(replay_app, path, data)
    assert status == 400, answer
    assert seconds < (5 if n == 200_000 else 10), (kind, n, seconds, answer)


@pytest.mark.parametrize(("kind", "n", "param"), [
    ("messages", 20_000, "messages"), ("tools", 5_000, "tools"), ("properties", 70_000, "tools"),
    ("calls", 20_000, "messages"), ("arguments", 70_000, "messages"), ("parts", 20_000, "messages"),
    ("input", 20_000, "input")])
def test_past_a_kinds_limit_the_request_is_refused_naming_it(replay_app, kind, n, param):
    path, data = many(kind, n)
    status, answer, _ = post_raw(replay_app, path, data)
    assert status == 400 and answer["error"]["code"] == "too_many_items", answer
    assert answer["error"]["param"] == param, answer


def test_many_small_items_that_cannot_fit_are_refused_before_rendering(qwen3_5_dir, tmp_path):
    # 2,000 one-character messages are under every limit but about 12,000 tokens: past a context of
    # 4,096, found from what each message adds through the template, without rendering them.
    replay = tmp_path / "steps.jsonl"
    replay.write_text('{"text": "Ok.<|im_end|>"}\n')
    app = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(replay), served_model_name=MODEL,
                             max_model_len=4096, trace_db="off")).start()
    try:
        for kind, n in (("messages", 2_000), ("tools", 300), ("calls", 800), ("arguments", 800), ("input", 2_000)):
            path, data = many(kind, n)
            status, answer, _ = post_raw(app, path, data)
            assert status == 400 and answer["error"]["code"] == "context_length_exceeded", (kind, answer)
            assert "resulted in at least" in answer["error"]["message"], (kind, answer)
        path, data = many("messages", 500)  # about 3,000 tokens: fits
        status, answer, _ = post_raw(app, path, data)
        assert status == 200, answer
    finally:
        app.stop()


# Images: their tokens and pixels counted from their headers, before any pixel is decoded.

@pytest.fixture(scope="module")
def image_app(qwen3_5_dir, tmp_path_factory):
    """The tiny Qwen3.5 with its real image processing (16,384 tokens for an image of 16 MP), a context of
    8,192, replaying "Ok."."""
    from tiny_media import with_images

    folder = tmp_path_factory.mktemp("images")
    (folder / "steps.jsonl").write_text('{"text": "Ok.<|im_end|>"}\n')
    app = AppThread(Settings(model=str(with_images(qwen3_5_dir, "qwen3_5")), backend="replay",
                             replay=str(folder / "steps.jsonl"), served_model_name=MODEL, max_model_len=8192,
                             trace_db="off")).start()
    yield app
    app.stop()


def image_chat(app, *urls: str) -> tuple[int, dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls] + [{"type": "text", "text": "What?"}]
    return chat(app, messages=[{"role": "user", "content": parts}], max_tokens=4)


def test_an_image_past_the_context_is_refused_from_its_header(image_app):
    # Its pixels were decoded (12 s and 1.35 GB at 33.5 MP) before the tokens they become were counted.
    # This one is a header alone: decoding it would fail; its size says 16,384 tokens, past 8,192.
    status, error = image_chat(image_app, image_headers.data_url("png", 4096, 4096))
    assert status == 400 and error["error"]["code"] == "context_length_exceeded", error
    assert "resulted in at least 16" in error["error"]["message"], error


def test_a_requests_images_are_held_to_a_pixel_budget(image_app):
    urls = [image_headers.data_url(fmt, 5000, 4000) for fmt in ("png", "gif")]  # 20 MP each, under the 33.5 MP limit
    status, error = image_chat(image_app, *urls)
    assert status == 400 and error["error"]["code"] == "media_too_large", error
    assert "--media-max-request-pixels" in error["error"]["message"] and error["error"]["param"].startswith(
        "messages[0].content[1]"), error
    image_app.replay("Ok.<|im_end|>")
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, "PNG")
    status, answer = image_chat(image_app, "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode())
    assert status == 200, answer


def test_an_image_is_decoded_holding_its_pixels_once():
    # The decoded pixels were copied twice more (EXIF orientation, the trace's thumbnail): three times
    # a 33.5 MP image's 128 MiB at once.
    from looptrace.families.media.decode import decode_image, thumbnail
    from looptrace.families.media.parts import MediaLimits, MediaPart

    buffer = io.BytesIO()
    Image.new("RGB", (4096, 4096), (200, 30, 30)).save(buffer, "PNG")
    part = MediaPart("image", base64.b64encode(buffer.getvalue()).decode(), "p")
    limits = MediaLimits(max_bytes=20 << 20, max_pixels=33_554_432, max_items=16, max_audio_seconds=30,
                         max_video_frames=64)
    pixels_mb = 4096 * 4096 * 4 / 2**20  # pillow holds RGB in 4 bytes a pixel

    def status(name: str) -> float:
        lines = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in lines if line.startswith(name)).split()[1]) / 1024

    Path("/proc/self/clear_refs").write_text("5")  # the peak so far is forgotten
    before = status("VmRSS")
    image = decode_image(part, limits)
    assert len(thumbnail(image)) < 20_000
    assert status("VmHWM") - before < 1.5 * pixels_mb, (status("VmHWM") - before, pixels_mb)


@pytest.mark.parametrize("request_head", [
    "GET /v1/models?x=" + "a" * 70_000 + " HTTP/1.1\r\nHost: x\r\n\r\n",  # a URL past 64 KiB
    "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Long: " + "b" * 70_000 + "\r\n\r\n",  # a header past it
    "NOT HTTP AT ALL\r\n\r\n"], ids=["url", "header", "garbage"])
def test_a_request_aiohttp_cannot_read_is_answered_in_the_api_shape(replay_app, request_head):
    # aiohttp answered these itself, before any handler ran, in plain text.
    import http.client
    import socket

    with socket.create_connection(("127.0.0.1", replay_app.port), timeout=30) as sock:
        sock.sendall(request_head.encode())
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = response.read()
    assert response.status == 400 and response.getheader("Content-Type", "").startswith("application/json"), body
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_http_request", error
    assert replay_app.call("GET", "/health")[0] == 200
