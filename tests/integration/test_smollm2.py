"""A real model end to end: SmolLM2-135M-Instruct from a GGUF file, called with the openai SDK."""

from __future__ import annotations

import http.client
import json

import pytest
from openai import OpenAI

from waiting import wait_until

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2(serve, smollm2_gguf_path):
    # transformers, dequantizing the file (a .gguf gets llama.cpp by default: tests/integration/test_llama_cpp.py);
    # llama.cpp's quantized kernels answer this question otherwise.
    return serve(str(smollm2_gguf_path), "--backend", "local", "--served-model-name", "smollm2")


@pytest.fixture(scope="module")
def client(smollm2):
    return OpenAI(base_url=smollm2.base_url, api_key="unused")


def test_answers_paris(client):
    reply = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=40)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens > 10
    assert 0 < reply.usage.completion_tokens <= 40
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streams_paris_with_usage(client):
    chunks = list(client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=40,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].usage.completion_tokens > 0 and not chunks[-1].choices


def test_a_client_that_disconnects_stops_its_generation(smollm2):
    body = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "Tell me a very long story."}],
                       "max_tokens": 400, "stream": True, "temperature": 0})
    connection = http.client.HTTPConnection("127.0.0.1", smollm2.port, timeout=60)
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    response.read1(64)  # the stream has begun
    assert smollm2.get("/health")[1]["requests_running"] == 1
    connection.close()
    # 400 tokens would take over ten seconds here; a stopped generation frees the model at once.
    wait_until(lambda: smollm2.get("/health")[1]["requests_running"] == 0, 3, every=0.05, what="the model freed")
