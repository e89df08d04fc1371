"""POST /v1/traces/{id}/fork on the local backend: the continuation from a replaced token equals what
the model generates greedily from the same prefix, the fork is a trace of its own linked to the
original, and every request that cannot be forked gets a clear 4xx; with the traces in SQLite and in
PostgreSQL alike."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from looptrace.proxy.settings import Settings

import stores as store_kinds
from app_thread import AppThread

MAX_TOKENS = 16
HEADERS = {"session_id": "fork-session", "User-Agent": "pytest-fork/1"}
ASK = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module", params=store_kinds.KINDS)
def local_app(request, qwen3_5_dir, tmp_path_factory):
    """conftest.py's local application, its traces in a SQLite file or in PostgreSQL: the module runs on each."""
    made = store_kinds.of_param(request, tmp_path_factory.mktemp("local"))
    app = AppThread(Settings(model=str(qwen3_5_dir), served_model_name="tiny-qwen", trace_db=made.setting())).start()
    yield app
    app.stop()
    made.close()


@pytest.fixture(scope="module")
def model(qwen3_5_dir):
    return AutoModelForCausalLM.from_pretrained(qwen3_5_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def original(local_app):
    """A greedy answer of MAX_TOKENS tokens, its stored trace and tokens."""
    status, answer = local_app.call("POST", "/v1/chat/completions", {
        "model": "tiny-qwen", "messages": ASK, "max_tokens": MAX_TOKENS, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}}, HEADERS)
    assert status == 200, answer
    session = local_app.stored("/v1/sessions/fork-session")
    trace_id = session["steps"][-1]["trace_id"]
    trace = local_app.stored(f"/v1/traces/{trace_id}")
    render = next(s for s in trace["spans"] if s["name"] == "render")
    tokens = local_app.stored(f"/v1/traces/{trace_id}/tokens")["tokens"]
    assert len(tokens) == MAX_TOKENS
    return trace_id, render["attributes"]["looptrace.prompt.ids"], tokens


def greedy(model, ids: list[int], n: int, stop: set[int]) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, eos_token_id=sorted(stop), pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_a_fork_from_an_alternative_continues_as_the_model_would(local_app, original, model):
    trace_id, prompt, tokens = original
    index = 3
    alternative = next(i for i in tokens[index]["top_ids"] if i != tokens[index]["id"])
    status, fork = local_app.call("POST", f"/v1/traces/{trace_id}/fork", {"index": index, "token_id": alternative})
    assert status == 200, fork
    looptrace = fork["looptrace"]
    assert looptrace["forked_from"] == {"trace_id": trace_id, "index": index}
    assert looptrace["replacement_ids"] == [alternative]
    assert looptrace["prefix_ids"] == [t["id"] for t in tokens[:index]] + [alternative]
    continued = [t["id"] for t in looptrace["tokens"]]
    # As long as the original could have run from here: the same budget, less the tokens kept.
    stop = set(local_app.runtime.family.stop_token_ids)
    expected = greedy(model, prompt + looptrace["prefix_ids"], MAX_TOKENS - index - 1, stop)
    assert continued == expected and len(continued) >= 4
    # Each continued token comes with the model's own view of it, and its alternatives as text.
    first = looptrace["tokens"][0]
    assert first["top_ids"][0] == first["id"] and len(first["top_texts"]) == 5
    # Shaped like a chat completion: the whole answer from the start, replacement included.
    assert fork["object"] == "chat.completion" and fork["choices"][0]["finish_reason"] in ("length", "stop")
    assert fork["usage"]["prompt_tokens"] == len(prompt) + index + 1


def test_a_fork_with_typed_text_reads_it_as_text(local_app, original, model):
    trace_id, prompt, tokens = original
    # A control token typed here is text, never a turn marker.
    status, fork = local_app.call("POST", f"/v1/traces/{trace_id}/fork", {"index": 0, "text": "<|im_end|>Blue", "max_tokens": 5})
    assert status == 200, fork
    replacement = fork["looptrace"]["replacement_ids"]
    tokenizer = local_app.runtime.tokenizer
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") not in replacement
    assert tokenizer.decode(replacement) == "<|im_end|>Blue"
    stop = set(local_app.runtime.family.stop_token_ids)
    assert [t["id"] for t in fork["looptrace"]["tokens"]] == greedy(model, prompt + replacement, 5, stop)


def test_the_fork_is_a_trace_linked_to_the_original(local_app, original):
    trace_id, _, tokens = original
    status, fork = local_app.call("POST", f"/v1/traces/{trace_id}/fork", {"index": 1, "token_id": tokens[1]["top_ids"][1]})
    assert status == 200, fork
    new = fork["looptrace"]["trace_id"]
    stored = local_app.stored(f"/v1/traces/{new}")
    root = next(s for s in stored["spans"] if s["parent_span_id"] is None)
    assert root["name"] == "fork tiny-qwen"
    assert root["attributes"]["looptrace.fork.trace_id"] == trace_id and root["attributes"]["looptrace.fork.index"] == 1
    original_root = next(s for s in local_app.stored(f"/v1/traces/{trace_id}")["spans"] if s["parent_span_id"] is None)
    assert {"trace_id": trace_id, "span_id": original_root["span_id"], "attributes": {"looptrace.link": "forked_from"}} \
        in root["links"]
    # Shown with the step it continued, not as a step of the session.
    session = local_app.stored("/v1/sessions/fork-session")
    assert [s["trace_id"] for s in session["steps"]] == [trace_id]
    assert new in session["steps"][0]["forks"]
    assert session["steps"][0]["trace_id"] != new


@pytest.mark.parametrize(("body", "status", "code", "param"), [
    ({"index": 99, "token_id": 1}, 400, "invalid_value", "index"),
    ({"index": -1, "token_id": 1}, 400, "invalid_value", "index"),
    ({"index": 0}, 400, "invalid_value", "token_id"),
    ({"index": 0, "token_id": 1, "text": "x"}, 400, "invalid_value", "token_id"),
    ({"index": 0, "token_id": 10**9}, 400, "invalid_value", "token_id"),
    ({"index": 0, "text": ""}, 400, "invalid_value", "text"),
    ({"token_id": 1}, 400, "missing_required_parameter", "index"),
    ({"index": "0", "token_id": 1}, 400, "invalid_type", "index"),
])
def test_a_bad_fork_request_is_a_400(local_app, original, body, status, code, param):
    got, error = local_app.call("POST", f"/v1/traces/{original[0]}/fork", body)
    assert got == status, error
    assert (error["error"]["code"], error["error"]["param"]) == (code, param)


def test_an_unknown_trace_is_a_404(local_app):
    status, error = local_app.call("POST", f"/v1/traces/{'0' * 32}/fork", {"index": 0, "token_id": 1})
    assert status == 404 and error["error"]["code"] == "trace_not_found"


def test_a_trace_of_another_model_is_refused(local_app, original):
    local_app.runtime.model_name = "another-model"
    try:
        status, error = local_app.call("POST", f"/v1/traces/{original[0]}/fork", {"index": 0, "token_id": 1})
    finally:
        local_app.runtime.model_name = "tiny-qwen"
    assert status == 409 and error["error"]["code"] == "model_mismatch"
    assert "tiny-qwen" in error["error"]["message"] and "another-model" in error["error"]["message"]


def test_no_content_and_replay_cannot_fork(qwen3_5_dir, tmp_path, replay_app):
    # Recorded with --no-trace-content: the ids were never kept.
    app = AppThread(Settings(model=str(qwen3_5_dir), served_model_name="tiny-qwen", trace_content=False,
                             trace_db=str(tmp_path / "traces.sqlite3"))).start()
    try:
        status, _ = app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": ASK, "max_tokens": 4},
                             {"session_id": "bare"})
        assert status == 200
        trace_id = app.stored("/v1/sessions/bare")["steps"][0]["trace_id"]
        status, error = app.call("POST", f"/v1/traces/{trace_id}/fork", {"index": 0, "token_id": 1})
        assert status == 400 and error["error"]["code"] == "trace_without_content"
    finally:
        app.stop()
    # The replay backend serves recordings: there is nothing to decode a fork with.
    replay_app.replay("Hello<|im_end|>")
    status, _ = replay_app.call("POST", "/v1/chat/completions", {"model": "tiny-qwen", "messages": ASK},
                                {"session_id": "replayed"})
    assert status == 200
    trace_id = replay_app.stored("/v1/sessions/replayed")["steps"][0]["trace_id"]
    status, error = replay_app.call("POST", f"/v1/traces/{trace_id}/fork", {"index": 0, "token_id": 1})
    assert status == 400 and error["error"]["code"] == "fork_unsupported"


def test_a_trace_continued_from_the_clients_traceparent_forks(local_app, original):
    # A client that sends a traceparent (its own tracing) makes looptrace's request span a child of
    # the client's span: the request is found by its mark, not as the span without a parent.
    _, _, tokens = original
    trace_id = "5b8efff798038103d269b633813fc60c"
    client_span = "eee19b7ec3c1b174"
    status, answer = local_app.call("POST", "/v1/chat/completions", {
        "model": "tiny-qwen", "messages": ASK, "max_tokens": 4, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False}}, {"traceparent": f"00-{trace_id}-{client_span}-01"})
    assert status == 200, answer
    trace = local_app.stored(f"/v1/traces/{trace_id}")
    request = next(s for s in trace["spans"] if "looptrace.endpoint" in s["attributes"])
    assert request["parent_span_id"] == client_span
    status, fork = local_app.call("POST", f"/v1/traces/{trace_id}/fork", {"index": 0, "token_id": tokens[0]["top_ids"][1]})
    assert status == 200, fork
    link = next(s for s in local_app.stored(f"/v1/traces/{fork['looptrace']['trace_id']}")["spans"]
                if s["parent_span_id"] is None)["links"][0]
    assert (link["trace_id"], link["span_id"]) == (trace_id, request["span_id"])
