"""Speculative decoding through the whole server (issue 15), with a real model copying from its prompt:
SmolLM2-135M-Instruct served with `--speculative-config` prompt lookup. Greedy answers on both APIs,
streamed and not, are token for token what plain decoding gives (transformers' `generate()`, which the
local backend matches without speculation); the drafts were real (accepted and rejected), each token's
marks and the decode span's counts are traced (the method too), the counters move under the method, and
the dashboard's acceptance panels show the rates in a real Prometheus.
"""

from __future__ import annotations

import http.client
import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from server import sse_events
from speculative_checks import ROUNDING, leads

MODEL = "smollm2-spec"
CONFIG = '{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
TEXT = ("The lighthouse keeper climbed the spiral stairs at dusk, trimmed the wick, wound the clockwork that "
        "turned the great lens, and wrote in the log: wind north-east, sea rising, two ships passed.")
ASK = [{"role": "user", "content": f"Repeat this text exactly:\n\n{TEXT}"}]
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def speculating(serve, smollm2_gguf_path):
    # The local backend: what is compared is transformers' generate() (llama.cpp's own prompt lookup is
    # tested in tests/integration/test_llama_cpp.py).
    return serve(str(smollm2_gguf_path), "--backend", "local", "--served-model-name", MODEL, "--speculative-config",
                 CONFIG)


@pytest.fixture(scope="module")
def expected(smollm2_gguf_path) -> list[int]:
    folder, name = smollm2_gguf_path.parent, smollm2_gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template(ASK, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
    # Why the served answers must equal these on any CPU: a verification pass's scores are a step's to
    # within rounding (under ROUNDING: speculative_checks.py measures it in process), and every winner
    # here leads by more than twice that, so no rounding can pick another token.
    lead = min(leads([row[0] for row in out.scores]))
    print(f"smallest lead of generate()'s winner: {lead:.3g}")
    assert lead > 2 * ROUNDING
    return out.sequences[0, len(ids):].tolist()


def decode_span(server, before: str | None) -> dict:
    trace = server.trace_after(before)
    return next(s for s in trace["spans"] if s["name"] == "decode")


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_greedy_answers_are_plain_decodings(speculating, expected, api, stream):
    server = speculating
    before = server.newest_trace_id()
    if api == "chat":
        body = {"model": MODEL, "messages": ASK, "max_tokens": NEW_TOKENS, "temperature": 0, "stream": stream}
        path = "/v1/chat/completions"
    else:
        body = {"model": MODEL, "input": ASK, "max_output_tokens": NEW_TOKENS, "temperature": 0, "stream": stream}
        path = "/v1/responses"
    if stream:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        status, events = response.status, sse_events(response.read())
        connection.close()
        assert status == 200 and events
    else:
        status, answer = server.post(path, body)
        assert status == 200, answer
    span = decode_span(server, before)
    marks = span["tokens"]
    assert [t["id"] for t in marks] == expected[:len(marks)] and len(marks) == len(expected)
    drafted = sum(t["drafted"] for t in marks)
    accepted = sum(t["accepted"] for t in marks)
    assert accepted > 10 and drafted > accepted  # it copied, and some drafts were wrong
    attributes = span["attributes"]
    assert attributes["looptrace.spec.accepted_tokens"] == accepted
    assert attributes["looptrace.spec.drafted_tokens"] >= drafted  # a rejected draft's followers are not marked
    assert attributes["looptrace.spec.drafts"] > 0 and attributes["looptrace.spec.method"] == "ngram"
    assert {t["draft_method"] for t in marks if t["drafted"]} == {"ngram"} and not any(
        t["draft_method"] for t in marks if not t["drafted"])


def test_health_says_how_it_speculates(speculating):
    status, body = speculating.get("/health")
    assert status == 200 and body["speculative"] == json.loads(CONFIG)


def test_counters_and_the_dashboards_acceptance_panels(speculating, tmp_path):
    from grafana_dashboards import DASHBOARDS, promql_targets
    from prometheus import Prometheus

    server = speculating
    prometheus = Prometheus([f"127.0.0.1:{server.port}"], tmp_path)
    try:
        prometheus.wait_ready()
        prometheus.wait_scraped()
        for _ in range(3):  # requests between scrapes, so rate() sees the counters move
            status, _ = server.post("/v1/chat/completions", {"model": MODEL, "messages": ASK, "temperature": 0,
                                                             "max_tokens": NEW_TOKENS})
            assert status == 200
            prometheus.wait_next_scrape()
        panels = [t for d in DASHBOARDS for t in promql_targets(json.loads(d.read_text()))
                  if "looptrace_spec_decode" in t["expr"] and "vllm:" not in t["expr"]]
        assert {t["panel"] for t in panels} >= {"Speculative acceptance rate", "Mean acceptance length"}, panels
        for target in panels:
            expr = target["expr"].replace('model="qwen"', f'model="{MODEL}"')
            by_method = {s["metric"].get("method"): float(s["value"][1]) for s in prometheus.wait_for(expr, timeout=30)}
            if "by (method)" in expr:  # the counts are under the method that drafted them; the others 0 ÷ 0
                value = by_method.pop("ngram")
                assert set(by_method) == {"suffix", "draft_model", "mtp"}, by_method
                assert all(math.isnan(v) for v in by_method.values()), (target["panel"], by_method)
            else:
                (value,) = by_method.values()
            assert math.isfinite(value), (target["panel"], expr)
            if "acceptance rate" in target["panel"].lower():
                assert 0 < value <= 1
            else:
                assert value > 1
    finally:
        prometheus.stop()
