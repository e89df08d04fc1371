"""POST /v1/score on the llama.cpp backend (SmolLM2-135M-Instruct's Q4_1 GGUF): an answer it generated,
read back in one pass with logits for every row of the answer's batches, gives each token the logprob,
rank and greedy choice its generation reported; an answer longer than one batch (512 tokens) gives
what llama-cpp-python computes for the same ids in the same batches with logits for every position.

The same batches, because llama.cpp's numbers depend on them: one pass of prompt and answer (batches
of 512 from the prompt's start) against the prompt, then the answer's batches, moved a token's
logprob by up to 0.39 on this test's 576 ids (a CI run) and 0.47 on a partly random answer, where no
greedy choice moved (llama-cpp-python 0.3.36). So the server keeps no prefix cache here: every score reads
its prompt from nothing, in one batch, then the answer 512 tokens at a time, as the reference does."""

from __future__ import annotations

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs pip install 'looptrace[llama-cpp]'")
from llama_binding import binding_llama  # noqa: E402 - after the binding is known to be there

from looptrace.backends.llama_cpp.context import physical_cores  # noqa: E402

pytestmark = pytest.mark.timeout(1200)

CONTEXT = 2048
HEADERS = {"session_id": "score-llama-cpp"}


@pytest.fixture(scope="module")
def server(serve, smollm2_gguf_path):
    return serve(str(smollm2_gguf_path), "--backend", "llama.cpp", "--served-model-name", "smollm2",
                 "--max-model-len", str(CONTEXT), "--prefix-cache-tokens", "0")


@pytest.fixture(scope="module")
def sampled(server):
    """A sampled answer (some tokens not the greedy choice): its prompt ids and its tokens as traced."""
    before = server.newest_trace_id()
    status, answer = server.post("/v1/chat/completions", {
        "model": "smollm2", "max_tokens": 48, "temperature": 1.3, "seed": 11,
        "messages": [{"role": "user", "content": "Tell me about lighthouses."}]}, headers=HEADERS)
    assert status == 200, answer
    trace = server.trace_after(before)
    render = next(s for s in trace["spans"] if s["name"] == "render")
    tokens = next(s for s in trace["spans"] if s["name"] == "decode")["tokens"]
    assert any(t["rank"] > 1 for t in tokens), "a sample that is all greedy proves nothing about rank"
    return render["attributes"]["looptrace.prompt.ids"], tokens


def scores(server, prompt: list[int], answer: list[int]) -> list[dict]:
    status, scored = server.post("/v1/score", {"prompt_ids": prompt, "answer_ids": answer})
    assert status == 200, scored
    assert scored["backend"] == "llama.cpp" and len(scored["tokens"]) == len(answer)
    return scored["tokens"]


def test_scores_are_what_generation_reported(server, sampled):
    prompt, tokens = sampled
    got = scores(server, prompt, [t["id"] for t in tokens])
    assert [s["greedy_id"] for s in got] == [t["top_ids"][0] for t in tokens]
    # llama.cpp computes a batch of rows and one row at a time with other kernels: float32 apart.
    assert [s["logprob"] for s in got] == pytest.approx([t["logprob"] for t in tokens], abs=2e-3)
    for s, t in zip(got, tokens):
        assert s["rank"] == t["rank"] or (t["rank"] > 20 and s["rank"] == pytest.approx(t["rank"], rel=0.05))


def test_an_answer_past_one_batch_is_what_llama_cpp_python_computes(server, sampled, smollm2_gguf_path):
    prompt, tokens = sampled
    answer = [t["id"] for t in tokens] * 12  # 576 tokens: the answer's rows come in two batches
    got = scores(server, prompt, answer)
    threads = physical_cores()
    llm = binding_llama(smollm2_gguf_path, n_ctx=CONTEXT, threads=threads,
                          flash_attn=True, logits_all=True, verbose=False)
    try:
        llm.eval(prompt)  # one batch, as the server reads it with no prefix cache
        llm.eval(answer[:-1])  # then batches of 512 (Llama's n_batch), the server's BATCH
        rows = np.array(llm.scores[len(prompt) - 1:len(prompt) + len(answer) - 1], dtype=np.float64)
    finally:
        llm.close()
    logprobs = rows - np.logaddexp.reduce(rows, axis=1, keepdims=True)
    # The same kernels on the same batches: 2e-6 apart when measured; a row read from the wrong place
    # is tenths to tens apart.
    assert [s["logprob"] for s in got] == pytest.approx(logprobs[np.arange(len(answer)), answer].tolist(), abs=1e-4)
    assert [s["rank"] for s in got] == [1 + int((row > row[token]).sum()) for row, token in zip(rows, answer)]
    assert [s["greedy_id"] for s in got] == rows.argmax(axis=1).tolist()
