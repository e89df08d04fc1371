"""Loading in the background: /health answers at once, requests wait, a failed load says why."""

from __future__ import annotations

import json
import threading

import pytest


def test_requests_wait_while_the_model_loads(serve, qwen3_5_dir):
    server = serve(str(qwen3_5_dir), "--served-model-name", "q", wait=False)
    status, health = 0, {}
    while status == 0:  # until the port answers
        status, health = server.get("/health")
    assert (status, health["status"]) == (503, "loading")
    answers = []
    waiter = threading.Thread(target=lambda: answers.append(server.post("/v1/chat/completions", {
        "model": "q", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})))
    waiter.start()
    waiter.join(timeout=120)
    status, body = answers[0]
    assert status == 200 and body["usage"]["completion_tokens"] == 2
    assert server.get("/health")[1]["status"] == "ready"


def test_an_unsupported_family_is_refused_before_any_weights(serve, tmp_path):
    folder = tmp_path / "bert"
    folder.mkdir()
    # Only a config: if loading got as far as weights it would fail differently.
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    server = serve(str(folder), wait=False)
    status, health = 0, {}
    while status == 0 or health.get("status") == "loading":
        status, health = server.get("/health")
    assert status == 503 and health["status"] == "failed"
    assert "bert" in health["reason"] and "qwen3_5" in health["reason"] and "gemma4" in health["reason"]
    status, error = server.post("/v1/chat/completions", {"model": str(folder), "messages": [{"role": "user", "content": "hi"}]})
    assert status == 503 and error["error"]["code"] == "model_load_failed"
    assert "bert" in error["error"]["message"]


@pytest.mark.parametrize("model, words", [
    ("/no/such/folder", "no checkpoint folder at /no/such/folder"),
    ("/tmp/missing.gguf", "no GGUF file at /tmp/missing.gguf"),
])
def test_a_missing_checkpoint_says_so(serve, model, words):
    server = serve(model, wait=False)
    status, health = 0, {}
    while status == 0 or health.get("status") == "loading":
        status, health = server.get("/health")
    assert health["status"] == "failed" and words in health["reason"]


def test_a_full_queue_answers_429(serve, qwen3_5_dir):
    import http.client

    server = serve(str(qwen3_5_dir), "--served-model-name", "q", "--max-queue", "1", "--max-model-len", "8192")
    ask = {"model": "q", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    # A: a long answer holds the model.
    busy = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    busy.request("POST", "/v1/chat/completions", json.dumps({**ask, "max_tokens": 6000, "stream": True}),
                 {"Content-Type": "application/json"})
    streaming = busy.getresponse()
    streaming.read1(64)
    # B: waits in the queue, the one place it has.
    waiter = []
    thread = threading.Thread(target=lambda: waiter.append(server.post("/v1/chat/completions", {**ask, "max_tokens": 2})))
    thread.start()
    while server.get("/health")[1]["requests_waiting"] < 1:
        pass
    # C: no room left.
    status, error = server.post("/v1/chat/completions", {**ask, "max_tokens": 2})
    assert status == 429 and error["error"]["code"] == "queue_full"
    assert "already waiting" in error["error"]["message"]
    busy.close()  # A leaves; B is served
    thread.join(timeout=120)
    assert waiter[0][0] == 200 and waiter[0][1]["usage"]["completion_tokens"] == 2
