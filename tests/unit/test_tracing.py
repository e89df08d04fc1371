"""Spans, the embedded store and the metrics of a tool-calling session, checked in process.

The app runs in this process (aiohttp's test server) with the replay backend, so the SDK's
in-memory exporter can sit beside the real SQLite store and see every span as it ends.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


from looptrace.proxy.settings import Settings
from looptrace.trace_store.tokens import expand_events

import load_once
from traced_app import App, run

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"]}}}
ASK = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
CALL = ("Let me check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>")
ANSWER = "Sunny in Paris, all three days.<|im_end|>"
LONG = " word" * 4000 + "<|im_end|>"
SESSION = {"session_id": "pi-session-1", "User-Agent": "pi/0.73.1 (linux)"}


def settings_for(qwen3_5_dir, tmp_path, steps, **extra) -> Settings:
    replay = tmp_path / "steps.jsonl"
    replay.write_text("".join(json.dumps({"text": s}) + "\n" for s in steps))
    extra.setdefault("trace_db", str(tmp_path / "traces.sqlite3"))
    return Settings(model=str(qwen3_5_dir), served_model_name="qwen", backend="replay", replay=str(replay), **extra)


def test_a_tool_calling_session_makes_the_documented_span_tree(qwen3_5_dir, tmp_path):
    tokenizer = load_once.tokenizer(qwen3_5_dir)

    async def session():
        async with App(settings_for(qwen3_5_dir, tmp_path, [CALL, ANSWER])) as app:
            status, first = await app.chat(headers=SESSION, messages=ASK, tools=[WEATHER])
            assert status == 200
            call = first["choices"][0]["message"]["tool_calls"][0]
            history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 C"}]
            second_text = await app.stream_text(headers=SESSION, messages=history, tools=[WEATHER],
                                                chat_template_kwargs={"enable_thinking": False})
            assert app.telemetry.flush()
            listed = await (await app.client.get("/v1/traces", params={"conversation": "pi-session-1"})).json()
            stored = [await (await app.client.get(f"/v1/traces/{row['trace_id']}")).json() for row in listed["data"]]
            metrics = await (await app.client.get("/metrics")).text()
            return app, first, call, second_text, listed, stored, metrics

    app, first, call, second_text, listed, stored, metrics = run(session())
    roots = [s for s in app.spans.get_finished_spans() if s.name == "chat qwen"]
    assert len(roots) == 2
    first_tree = app.tree(roots[0].context.trace_id)
    assert set(first_tree) == {"chat qwen", "render", "prefill", "decode", "execute_tool get_weather"}
    root = first_tree["chat qwen"]
    assert root.parent is None and root.kind.name == "SERVER"
    assert all(s.parent.span_id == root.context.span_id for n, s in first_tree.items() if n != "chat qwen")

    attrs = root.attributes
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.provider.name"] == "looptrace"
    assert attrs["gen_ai.request.model"] == "qwen" and attrs["gen_ai.request.stream"] is False
    assert attrs["gen_ai.response.id"] == first["id"]
    assert list(attrs["gen_ai.response.finish_reasons"]) == ["tool_calls"]
    assert attrs["gen_ai.usage.input_tokens"] == first["usage"]["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == first["usage"]["completion_tokens"]
    assert attrs["gen_ai.usage.reasoning.output_tokens"] == first["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    assert attrs["gen_ai.conversation.id"] == "pi-session-1"
    assert attrs["looptrace.client.name"] == "pi" and attrs["looptrace.client.version"] == "0.73.1"
    assert attrs["http.response.status_code"] == 200
    assert {"gen_ai.request.temperature", "gen_ai.request.top_p", "gen_ai.request.top_k",
            "gen_ai.request.max_tokens"} <= set(attrs)
    assert attrs["gen_ai.request.presence_penalty"] == attrs["gen_ai.request.frequency_penalty"] == 0.0
    assert not any("authorization" in key.lower() for key in attrs)

    render = first_tree["render"].attributes
    ids = list(render["looptrace.prompt.ids"])
    assert tokenizer(render["looptrace.prompt.text"], add_special_tokens=False)["input_ids"] == ids
    assert render["looptrace.prompt.tokens"] == len(ids) == first["usage"]["prompt_tokens"]
    assert render["looptrace.family"] == "qwen3_5" and len(render["looptrace.template.sha256"]) == 64
    assert render["looptrace.prompt.new_offset"] == 0  # the conversation's first request

    decode = first_tree["decode"]
    tokens = expand_events([{"name": e.name, "attributes": e.attributes} for e in decode.events])
    assert [t["index"] for t in tokens] == list(range(first["usage"]["completion_tokens"]))
    assert tokenizer.decode([t["id"] for t in tokens]) == CALL
    assert "".join(t["text"] for t in tokens) == CALL.removesuffix("<|im_end|>")  # a stop token adds no text
    assert {t["channel"] for t in tokens} == {"thought", "tool_call", "content"}
    assert all(len(t["top_ids"]) == len(t["top_pieces"]) == len(t["top_p"]) >= 1 for t in tokens)

    tool = first_tree["execute_tool get_weather"].attributes
    assert tool["gen_ai.tool.call.id"] == call["id"] and tool["gen_ai.tool.name"] == "get_weather"
    assert json.loads(tool["gen_ai.tool.call.arguments"]) == {"city": "Paris", "days": 3}
    assert tool["looptrace.tool.outcome"] == "valid" and "<function=get_weather>" in tool["looptrace.tool.raw"]

    # The second request: what is new in it, the tool's result linked to its call, and its text.
    second_tree = app.tree(roots[1].context.trace_id)
    render2 = second_tree["render"]
    assert 0 < render2.attributes["looptrace.prompt.new_offset"] < render2.attributes["looptrace.prompt.tokens"]
    assert "sunny, 21 C" in render2.attributes["looptrace.prompt.new_text"]
    assert render2.links[0].context.span_id == first_tree["execute_tool get_weather"].context.span_id
    result = [e for e in render2.events if e.name == "looptrace.tool_result"][0].attributes
    assert result["looptrace.tool.result"] == "sunny, 21 C"
    tokens2 = expand_events([{"name": e.name, "attributes": e.attributes} for e in second_tree["decode"].events])
    assert "".join(t["text"] for t in tokens2) == second_text == ANSWER.removesuffix("<|im_end|>")

    # The store holds the same, newest first, with the result attached to the call's span.
    assert [r["trace_id"] for r in listed["data"]] == [format(r.context.trace_id, "032x") for r in reversed(roots)]
    assert listed["data"][1]["input_tokens"] == first["usage"]["prompt_tokens"]
    first_stored = {s["name"]: s for s in stored[1]["spans"]}
    assert first_stored["execute_tool get_weather"]["attributes"]["looptrace.tool.result"] == "sunny, 21 C"
    assert [t["id"] for t in first_stored["decode"]["tokens"]] == [t["id"] for t in tokens]
    assert first_stored["render"]["attributes"]["looptrace.prompt.text"] == render["looptrace.prompt.text"]

    assert 'looptrace_tool_calls_total{model="qwen",outcome="valid"} 1.0' in metrics
    assert 'looptrace_requests_total{endpoint="chat",model="qwen",status="200"} 2.0' in metrics


def test_four_thousand_tokens_keep_four_thousand_events(qwen3_5_dir, tmp_path):
    async def session():
        async with App(settings_for(qwen3_5_dir, tmp_path, [LONG])) as app:
            status, body = await app.chat(messages=ASK, max_tokens=5000, chat_template_kwargs={"enable_thinking": False})
            assert app.telemetry.flush()
            stored = await (await app.client.get(f"/v1/traces/{format(app.spans.get_finished_spans()[-1].context.trace_id, '032x')}")).json()
            return app, body, stored

    app, body, stored = run(session())
    count = body["usage"]["completion_tokens"]
    assert count >= 4000
    decode = [s for s in app.spans.get_finished_spans() if s.name == "decode"][0]
    assert len(expand_events([{"name": e.name, "attributes": e.attributes} for e in decode.events])) == count
    tokens = {s["name"]: s for s in stored["spans"]}["decode"]["tokens"]
    assert [t["index"] for t in tokens] == list(range(count))


def test_no_trace_content_keeps_numbers_not_words(qwen3_5_dir, tmp_path):
    async def session():
        async with App(settings_for(qwen3_5_dir, tmp_path, [ANSWER], trace_content=False)) as app:
            await app.chat(messages=ASK, chat_template_kwargs={"enable_thinking": False})
            assert app.telemetry.flush()
            return app

    app = run(session())
    spans = {s.name: s for s in app.spans.get_finished_spans()}
    assert "looptrace.prompt.text" not in spans["render"].attributes
    assert "looptrace.prompt.ids" not in spans["render"].attributes
    tokens = expand_events([{"name": e.name, "attributes": e.attributes} for e in spans["decode"].events])
    assert tokens and all("text" not in t and "id" not in t and "piece" not in t for t in tokens)
    assert all(0 < t["p"] <= 1 for t in tokens)
    stored = Path(app.settings.trace_db).read_bytes()
    assert b"Sunny" not in stored and b"Weather in Paris" not in stored


def test_an_incoming_traceparent_is_continued(qwen3_5_dir, tmp_path):
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    async def session():
        async with App(settings_for(qwen3_5_dir, tmp_path, [ANSWER])) as app:
            await app.chat(headers={"traceparent": parent}, messages=ASK)
            return app

    app = run(session())
    root = [s for s in app.spans.get_finished_spans() if s.name == "chat qwen"][0]
    assert format(root.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert format(root.parent.span_id, "016x") == "b7ad6b7169203331"


def test_a_store_that_cannot_write_never_fails_a_request(qwen3_5_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    # Its parent is a file: every write fails, as on a read-only or vanished disk.
    settings = settings_for(qwen3_5_dir, tmp_path, [ANSWER, ANSWER], trace_db=str(blocker / "traces.sqlite3"))

    async def session():
        async with App(settings) as app:
            no_thinking = {"chat_template_kwargs": {"enable_thinking": False}}
            results = [await app.chat(messages=ASK, **no_thinking), await app.chat(messages=ASK, **no_thinking)]
            app.telemetry.flush()
            metrics = await (await app.client.get("/metrics")).text()
            return results, metrics

    results, metrics = run(session())
    assert [status for status, _ in results] == [200, 200]
    assert results[0][1]["choices"][0]["message"]["content"] == "Sunny in Paris, all three days."
    dropped = [line for line in metrics.splitlines() if line.startswith('looptrace_trace_spans_dropped_total{sink="sqlite"}')]
    assert float(dropped[0].split()[-1]) >= 8  # both requests' spans: root, render, prefill, decode each


def test_a_stored_trace_replays_its_tokens(qwen3_5_dir, tmp_path):
    settings = settings_for(qwen3_5_dir, tmp_path, [CALL])

    async def record():
        async with App(settings) as app:
            status, body = await app.chat(headers=SESSION, messages=ASK, tools=[WEATHER])
            assert app.telemetry.flush()
            return body, format(app.spans.get_finished_spans()[-1].context.trace_id, "032x")

    original, trace_id = run(record())

    async def replay(spec):
        again = Settings(model=str(qwen3_5_dir), served_model_name="qwen", backend="replay", replay=spec,
                         trace_db=settings.trace_db)
        async with App(again) as app:
            return await app.chat(messages=ASK, tools=[WEATHER])

    for spec in (trace_id, "conversation:pi-session-1"):
        status, body = run(replay(spec))
        assert status == 200
        assert body["choices"][0]["message"]["tool_calls"][0]["function"] == \
            original["choices"][0]["message"]["tool_calls"][0]["function"]
        assert body["usage"]["completion_tokens"] == original["usage"]["completion_tokens"]


def test_a_responses_request_is_traced_the_same_way(qwen3_5_dir, tmp_path):
    codex_headers = {"session-id": "codex-thread-7", "User-Agent": "codex_exec/0.169.0 (Linux; x86_64)"}

    async def session():
        async with App(settings_for(qwen3_5_dir, tmp_path, [CALL])) as app:
            response = await app.client.post("/v1/responses", headers=codex_headers, json={
                "model": "qwen", "input": "Weather in Paris for 3 days?", "stream": True,
                "tools": [{"type": "function", **WEATHER["function"]}]})
            text = await response.text()
            assert response.status == 200 and "response.completed" in text
            assert app.telemetry.flush()
            return app, text

    app, text = run(session())
    root = [s for s in app.spans.get_finished_spans() if s.name == "responses qwen"][0]
    tree = app.tree(root.context.trace_id)
    assert set(tree) == {"responses qwen", "render", "prefill", "decode", "execute_tool get_weather"}
    assert root.attributes["gen_ai.conversation.id"] == "codex-thread-7"
    assert root.attributes["looptrace.client.name"] == "codex_exec"
    assert root.attributes["gen_ai.response.id"].startswith("resp_") and root.attributes["gen_ai.response.id"] in text
    assert list(root.attributes["gen_ai.response.finish_reasons"]) == ["tool_calls"]


def test_retention_drops_old_traces_then_the_oldest_past_the_size(tmp_path):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from looptrace.trace_store.sqlite.store import SQLiteTraceStore

    store = SQLiteTraceStore(tmp_path / "t.sqlite3", retention_seconds=3600, max_bytes=1 << 40)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(store))
    tracer = provider.get_tracer("test")
    now = time.time_ns()
    ids = []
    for age_hours in (5, 4, 0.5, 0.2, 0.1):  # the first two are past an hour's retention
        start = now - int(age_hours * 3600e9)
        root = tracer.start_span("chat m", start_time=start, attributes={"looptrace.endpoint": "chat",
                                                                       "looptrace.prompt.text": "x" * 200_000})
        root.end(end_time=start + 1_000_000)
        ids.append(format(root.get_span_context().trace_id, "032x"))
    store.enforce_retention()
    assert [t["trace_id"] for t in store.list_traces()["data"]] == ids[:1:-1]  # newest first, the two old ones gone
    store.max_bytes = 450_000  # room for about two of the 200 kB traces
    store.enforce_retention()
    kept = [t["trace_id"] for t in store.list_traces()["data"]]
    assert kept == ids[:-3:-1][: len(kept)] and 1 <= len(kept) <= 2  # the newest stay
    assert store.get_trace(ids[2]) is None
    assert (tmp_path / "t.sqlite3").stat().st_size <= 600_000  # the file shrank, not just the rows


def test_the_store_writes_what_orjson_refuses(tmp_path):
    # orjson encodes the store's spans; a lone surrogate or an integer past 64 bits goes through json.
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from looptrace.trace_store.sqlite.store import SQLiteTraceStore

    store = SQLiteTraceStore(tmp_path / "t.sqlite3")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(store))
    span = provider.get_tracer("test").start_span("chat m", attributes={
        "looptrace.endpoint": "chat", "odd.text": "half \ud800 pair", "odd.int": 2**70, "plain": "caf\u00e9"})
    span.add_event("looptrace.tokens", {"looptrace.token.logprob": (-0.5, float("-inf"))})
    span.end()
    stored = store.get_trace(format(span.get_span_context().trace_id, "032x"))["spans"][0]
    assert stored["attributes"]["odd.text"] == "half \ud800 pair"
    assert stored["attributes"]["odd.int"] == 2**70 and stored["attributes"]["plain"] == "caf\u00e9"
    assert stored["events"][0]["attributes"]["looptrace.token.logprob"] == [-0.5, None]  # JSON has no -inf
