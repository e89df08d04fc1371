"""Spans across a process boundary: the traceparent looptrace hands a vLLM server (the vLLM test double,
a process of its own) names looptrace's `decode` span. The spans of one process are checked in
tests/unit/test_tracing.py."""

from __future__ import annotations

from looptrace.proxy.settings import Settings

from server import free_port
from traced_app import App, run
from vllm_double import DoubleProcess

ASK = [{"role": "user", "content": "Weather in Paris for 3 days?"}]


def test_the_vllm_server_is_handed_our_decode_span(qwen3_5_dir, tmp_path):
    """The traceparent vLLM receives names our `decode` span, so its own span nests under it."""
    double = DoubleProcess(qwen3_5_dir, port=free_port(), log_path=tmp_path / "double.log")
    try:
        double.wait_ready()
        settings = Settings(model=None, backend="vllm", vllm_urls=[double.url], trace_db=str(tmp_path / "t.sqlite3"))

        async def session():
            async with App(settings) as app:
                model = (await (await app.client.get("/health")).json())["model"]
                response = await app.client.post("/v1/chat/completions", json={
                    "model": model, "messages": ASK, "max_tokens": 4})
                assert response.status == 200, await response.text()
                return app

        app = run(session())
        decode = [s for s in app.spans.get_finished_spans() if s.name == "decode"][0]
        sent = [r for r in double.requests() if r["path"] != "/v1/models" and "traceparent" in r["headers"]][-1]
        _, trace_id, span_id, _ = sent["headers"]["traceparent"].split("-")
        assert trace_id == format(decode.context.trace_id, "032x")
        assert span_id == format(decode.context.span_id, "016x")
        assert decode.attributes["looptrace.backend"] == "vllm"
        assert decode.attributes["looptrace.backend.route"] == sent["path"]
    finally:
        double.stop()
