"""A real Prometheus scrapes a running looptrace: rates, quantiles and exemplars that lead to traces."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from prometheus import Prometheus
from waiting import wait_until

CALL = ("\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>")
STEPS = [CALL, "It is sunny.\n</think>\n\nSunny.<|im_end|>", "\n</think>\n\nHello again.<|im_end|>"] * 3
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}


@pytest.fixture(scope="module")
def scraped(serve, qwen3_5_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prometheus")
    replay = workdir / "steps.jsonl"
    replay.write_text("".join(json.dumps({"text": s}) + "\n" for s in STEPS))
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(replay), "--served-model-name", "qwen")
    prometheus = Prometheus([f"127.0.0.1:{server.port}"], workdir)
    try:
        prometheus.wait_ready()
        prometheus.wait_scraped()
        client = OpenAI(base_url=server.base_url, api_key="unused")
        ask = [{"role": "user", "content": "Weather?"}]
        for _ in range(3):  # requests between scrapes, so rate() sees counters move
            client.chat.completions.create(model="qwen", messages=ask, tools=[WEATHER])
            list(client.chat.completions.create(model="qwen", messages=ask, stream=True))
            client.chat.completions.create(model="qwen", messages=ask)
            prometheus.wait_next_scrape()
        yield server, prometheus
    finally:
        prometheus.stop()


def test_generation_token_rate_by_channel(scraped):
    server, prometheus = scraped
    result = prometheus.wait_for('rate(looptrace_generation_tokens_total{model="qwen"}[1m])')
    channels = {series["metric"]["channel"] for series in result}
    assert channels == {"thought", "content", "tool_call"}
    assert any(float(series["value"][1]) > 0 for series in result)


def test_time_to_first_token_median(scraped):
    server, prometheus = scraped
    result = prometheus.wait_for(
        'histogram_quantile(0.5, sum by (le) (rate(looptrace_time_to_first_token_seconds_bucket{model="qwen"}[1m])))')
    assert len(result) == 1
    assert 0 < float(result[0]["value"][1]) < 10


def test_tool_calls_and_requests_counted(scraped):
    server, prometheus = scraped
    tools = prometheus.wait_for('looptrace_tool_calls_total{model="qwen"}')
    assert [(s["metric"]["outcome"], s["value"][1]) for s in tools] == [("valid", "3")]
    requests = prometheus.wait_for('sum(looptrace_requests_total{model="qwen",status="200"})')
    assert requests[0]["value"][1] == "9"


def test_exemplars_lead_to_stored_traces(scraped):
    server, prometheus = scraped
    found = wait_until(lambda: prometheus.exemplars('looptrace_time_to_first_token_seconds_bucket{model="qwen"}'), 30,
                       every=0.5)
    trace_ids = {e["labels"]["trace_id"] for series in found for e in series["exemplars"]}
    assert trace_ids
    for trace_id in trace_ids:
        status, body = server.get(f"/v1/traces/{trace_id}")
        assert status == 200, (trace_id, body)
        assert body["spans"][0]["trace_id"] == trace_id


def test_observing_a_group_of_gaps_at_once_counts_as_observing_each():
    """proxy/observe/metrics.observe_all, which the tracer uses for a group's inter-token gaps, gives
    the exposition that one `observe` per value gives: every bucket, the count and the sum."""
    import random

    from prometheus_client import generate_latest

    from looptrace.proxy.observe.metrics import ITL_BUCKETS, Metrics, observe_all

    rng = random.Random(7)
    gaps = [rng.choice([rng.uniform(0, 3), *ITL_BUCKETS]) for _ in range(500)]  # on the bounds too
    one, many = Metrics(), Metrics()
    for gap in gaps:
        one.itl.labels("m").observe(gap)
    observe_all(many.itl.labels("m"), gaps[:200])
    observe_all(many.itl.labels("m"), gaps[200:])

    def itl(metrics: Metrics) -> dict[str, float]:
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in
                generate_latest(metrics.registry).decode().splitlines()
                if line.startswith("looptrace_inter_token_latency_seconds_") and "_created" not in line}

    exact, batched = itl(one), itl(many)
    total = 'looptrace_inter_token_latency_seconds_sum{model="m"}'
    assert exact.pop(total) == pytest.approx(batched.pop(total), rel=1e-12)  # summed in another order
    assert exact == batched and len(exact) == len(ITL_BUCKETS) + 2  # every bucket, +Inf and the count
    assert exact['looptrace_inter_token_latency_seconds_count{model="m"}'] == len(gaps)
