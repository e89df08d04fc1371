"""Spans as they leave over OTLP: every turn whole while the store keeps what each adds, and each tool
call's span with the tool's result. The application runs in this process with the replay backend;
its OTLP sink's transport is the SDK's in-memory exporter (the real receiver, Arize Phoenix, is
tests/integration/test_otlp.py's), so these tests read exactly what would have been sent."""

from __future__ import annotations

import json
import sqlite3

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from looptrace.common import attributes as attr
from looptrace.proxy.settings import Settings
from looptrace.trace_store.chains import DELTA_KEYS
from looptrace.trace_store.otlp import OutgoingSpans
from looptrace.trace_store.processor import QueueingSpanProcessor

import load_once
from traced_app import App, run
from waiting import wait_until

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
STEPS = ["I need the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
         "</parameter>\n</function>\n</tool_call><|im_end|>",
         "And the time.\n</think>\n\n<tool_call>\n<function=get_time>\n<parameter=city>\nParis\n"
         "</parameter>\n</function>\n</tool_call><|im_end|>",
         "Both known.\n</think>\n\nSunny and 21 C in Paris, at noon.<|im_end|>"]
RESULTS = ["sunny, 21 C", "12:00"]
SESSION = {"session_id": "otlp-session"}
DELTAS = set(DELTA_KEYS["prompt"] + DELTA_KEYS["input"])


class Exporting(App):
    """The app with an OTLP endpoint, whose sink sends to memory (`sent`) instead of the network."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.sent = InMemorySpanExporter()

    async def __aenter__(self):
        await super().__aenter__()
        (otlp,) = [p for p in self.telemetry.processors if p.name == "otlp"]
        otlp.exporter = self.sent
        return self


def exporting(settings: Settings) -> tuple[App, InMemorySpanExporter]:
    app = Exporting(settings)
    return app, app.sent


def settings_for(qwen3_5_dir, tmp_path, steps, **extra) -> Settings:
    replay = tmp_path / "steps.jsonl"
    replay.write_text("".join(json.dumps({"text": s}) + "\n" for s in steps))
    extra.setdefault("trace_db", str(tmp_path / "traces.sqlite3"))
    return Settings(model=str(qwen3_5_dir), served_model_name="qwen", backend="replay", replay=str(replay), **extra)


async def tool_conversation(app: App, turns: int = 3) -> list[str]:
    """Three turns: a call, another call after the first result, the answer after the second; trace ids."""
    messages, traces = [{"role": "user", "content": "Weather and time in Paris?"}], []
    for turn in range(turns):
        status, body = await app.chat(headers=SESSION, messages=messages, tools=[WEATHER, TIME])
        assert status == 200, body
        traces.append(body)
        message = body["choices"][0]["message"]
        if not message.get("tool_calls"):
            break
        messages = messages + [{"role": "assistant", "content": message.get("content"),
                                "tool_calls": message["tool_calls"]},
                               {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                                "content": RESULTS[turn]}]
    return traces


def roots_in_order(spans) -> list:
    return sorted((s for s in spans if attr.ENDPOINT in (s.attributes or {})), key=lambda s: s.start_time)


def by_trace(spans, trace_id: int) -> dict:
    return {s.name: s for s in spans if s.context.trace_id == trace_id}


def test_spans_sent_over_otlp_are_whole_from_the_second_turn_on(qwen3_5_dir, tmp_path):
    tokenizer = load_once.tokenizer(qwen3_5_dir)
    app, sent = exporting(settings_for(qwen3_5_dir, tmp_path, STEPS, otlp_endpoint="http://127.0.0.1:9/unused"))

    async def session():
        async with app:
            answers = await tool_conversation(app)
            assert app.telemetry.flush()
            stored = [await (await app.client.get(f"/v1/traces/{format(r.context.trace_id, '032x')}")).json()
                      for r in roots_in_order(app.spans.get_finished_spans())]
            return answers, stored

    answers, stored = run(session())
    assert len(answers) == 3
    exported = sent.get_finished_spans()
    roots = roots_in_order(exported)
    assert len(roots) == 3
    for n, (root, trace) in enumerate(zip(roots, stored)):
        spans = by_trace(exported, root.context.trace_id)
        whole = {s["name"]: s["attributes"] for s in trace["spans"]}
        for name, span in spans.items():
            assert not DELTAS & set(span.attributes), (n, name)  # deltas are the store's alone
        # What a collector receives is what the store reads back whole.
        messages = json.loads(root.attributes[attr.GEN_AI_INPUT_MESSAGES])
        assert messages == json.loads(whole[root.name][attr.GEN_AI_INPUT_MESSAGES])
        assert len(messages) == 1 + 2 * n  # the question, then each call and its result
        render = spans[attr.SPAN_RENDER].attributes
        assert list(render[attr.PROMPT_IDS]) == whole[attr.SPAN_RENDER][attr.PROMPT_IDS]
        assert render[attr.PROMPT_TEXT] == whole[attr.SPAN_RENDER][attr.PROMPT_TEXT]
        ids = list(render[attr.PROMPT_IDS])
        assert tokenizer(render[attr.PROMPT_TEXT], add_special_tokens=False)["input_ids"] == ids
        assert render[attr.PROMPT_TOKENS] == answers[n]["usage"]["prompt_tokens"]
    # The store keeps each later turn as what it adds, and nothing only the export needs.
    with sqlite3.connect(app.settings.trace_db) as db:
        bases = db.execute("SELECT kind, count(base) FROM trace_bases GROUP BY kind ORDER BY kind").fetchall()
        rows = [json.loads(a) for (a,) in db.execute("SELECT attributes FROM spans")]
    assert bases == [("input", 2), ("prompt", 2)]
    continuing = [r for r in rows if attr.PROMPT_BASE_TRACE_ID in r or attr.INPUT_BASE_TRACE_ID in r]
    assert len(continuing) == 4 and not any(attr.PROMPT_IDS in r or attr.GEN_AI_INPUT_MESSAGES in r for r in continuing)
    assert not any(key in r for r in rows for key in attr.EXPORTED_ONLY)


def test_an_execute_tool_span_is_exported_with_its_result(qwen3_5_dir, tmp_path):
    app, sent = exporting(settings_for(qwen3_5_dir, tmp_path, STEPS, otlp_endpoint="http://127.0.0.1:9/unused"))

    async def session():
        async with app:
            answers = await tool_conversation(app)
            assert app.telemetry.flush()
            return answers

    answers = run(session())
    exported = sent.get_finished_spans()
    roots = roots_in_order(exported)
    tools = sorted((s for s in exported if s.name.startswith(attr.SPAN_EXECUTE_TOOL)), key=lambda s: s.start_time)
    assert [s.name for s in tools] == ["execute_tool get_weather", "execute_tool get_time"]
    for n, tool in enumerate(tools):
        assert tool.attributes[attr.GEN_AI_TOOL_CALL_ID] == answers[n]["choices"][0]["message"]["tool_calls"][0]["id"]
        assert tool.attributes[attr.GEN_AI_TOOL_CALL_RESULT] == RESULTS[n]
        # the request that brought the result
        assert tool.attributes[attr.TOOL_RESULT_TRACE_ID] == format(roots[n + 1].context.trace_id, "032x")
        assert tool.context.trace_id == roots[n].context.trace_id and tool.parent.span_id == roots[n].context.span_id


def test_without_an_otlp_endpoint_a_continuing_turn_writes_only_what_it_adds(qwen3_5_dir, tmp_path):
    # The per-turn cost stays what the turn adds: no whole prompt or message list is built for nobody.
    async def session():
        async with App(settings_for(qwen3_5_dir, tmp_path, STEPS)) as app:
            await tool_conversation(app)
            return app

    app = run(session())
    spans = app.spans.get_finished_spans()
    last = roots_in_order(spans)[-1]
    render = by_trace(spans, last.context.trace_id)[attr.SPAN_RENDER].attributes
    assert attr.PROMPT_BASE_TRACE_ID in render and attr.PROMPT_IDS not in render and attr.PROMPT_TEXT not in render
    assert attr.INPUT_BASE_TRACE_ID in last.attributes and attr.GEN_AI_INPUT_MESSAGES not in last.attributes
    assert not any(key in (s.attributes or {}) for s in spans for key in attr.EXPORTED_ONLY)


def test_phoenix_reads_each_turns_input_answer_and_reasoning(qwen3_5_dir, tmp_path):
    app, sent = exporting(settings_for(qwen3_5_dir, tmp_path, STEPS, otlp_endpoint="http://127.0.0.1:9/unused"))

    async def session():
        async with app:
            answers = await tool_conversation(app)
            assert app.telemetry.flush()
            return answers

    answers = run(session())
    exported = sent.get_finished_spans()
    roots = roots_in_order(exported)
    inputs = [r.attributes[attr.INPUT_VALUE] for r in roots]
    assert inputs == ["Weather and time in Paris?", "tool: sunny, 21 C", "tool: 12:00"]
    assert roots[0].attributes[attr.OUTPUT_VALUE] == 'get_weather({"city": "Paris"})'
    assert roots[2].attributes[attr.OUTPUT_VALUE] == answers[2]["choices"][0]["message"]["content"]
    assert {r.attributes[attr.INPUT_MIME_TYPE] for r in roots} == {r.attributes[attr.OUTPUT_MIME_TYPE] for r in roots} \
        == {"text/plain"}
    for root, answer in zip(roots, answers):
        reasoning = root.attributes[attr.LLM_TOKEN_COUNT_COMPLETION_DETAILS_REASONING]
        assert reasoning == answer["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
        spans = by_trace(exported, root.context.trace_id)
        kinds = {name: s.attributes.get(attr.OPENINFERENCE_SPAN_KIND) for name, s in spans.items()}
        assert (kinds["render"], kinds["prefill"], kinds["decode"]) == ("PROMPT", "CHAIN", "CHAIN")
        assert kinds[root.name] is None  # Phoenix derives LLM from gen_ai.operation.name itself


# -- what is held back, and for how long ---------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def recorded_session(qwen3_5_dir, tmp_path, turns: int, **extra) -> tuple[App, list]:
    """A tool conversation of `turns` requests, its spans as they ended (no OTLP sink)."""
    async def session():
        async with App(settings_for(qwen3_5_dir, tmp_path, STEPS, **extra)) as app:
            await tool_conversation(app, turns)
            assert app.telemetry.flush()
            return app

    app = run(session())
    return app, sorted(app.spans.get_finished_spans(), key=lambda s: s.end_time)


def test_a_tool_span_whose_result_never_comes_goes_without_it_after_the_wait(qwen3_5_dir, tmp_path):
    app, spans = recorded_session(qwen3_5_dir, tmp_path, 1)
    clock = Clock()
    outgoing = OutgoingSpans(wait=600, clock=clock)
    sent = outgoing.take(spans)
    assert {s.name for s in sent} == {"chat qwen", "render", "prefill", "decode"} and outgoing.held == 1
    clock.now += 599
    assert outgoing.take([]) == [] and outgoing.due_in() == 1
    clock.now += 1
    (tool,) = outgoing.take([])
    assert tool.name == "execute_tool get_weather" and attr.GEN_AI_TOOL_CALL_RESULT not in tool.attributes
    assert outgoing.held == outgoing.held_bytes == 0 and outgoing.due_in() is None


def test_held_tool_spans_are_bounded_and_all_go_at_shutdown(qwen3_5_dir, tmp_path):
    app, spans = recorded_session(qwen3_5_dir, tmp_path, 1)
    (tool,) = [s for s in spans if s.name.startswith(attr.SPAN_EXECUTE_TOOL)]
    outgoing = OutgoingSpans(max_held=1)
    assert outgoing.take([tool]) == [] and outgoing.held == 1
    again = OutgoingSpans(max_held=1)
    again.take([tool])
    # A second call pushes the first out (the oldest goes first), and shutdown sends all held.
    twin = type(tool)(name=tool.name, context=tool.context, parent=tool.parent, resource=tool.resource,
                      attributes={**tool.attributes, attr.GEN_AI_TOOL_CALL_ID: "call_other"}, kind=tool.kind,
                      start_time=tool.start_time, end_time=tool.end_time)
    assert again.take([twin]) == [tool]
    assert again.take([], everything=True) == [twin] and again.held == 0
    without_content = OutgoingSpans(hold=False)
    assert without_content.take([tool]) == [tool]  # no result would ever be added: sent at once


def test_a_result_another_process_brought_is_read_from_the_shared_store(qwen3_5_dir, tmp_path, stores):
    # Turn 1 on one process, turn 2 on another (--workers: the kernel spreads connections): the first
    # holds its tool span, and finds the result the second stored.
    setting = stores.setting()
    first, spans = recorded_session(qwen3_5_dir, tmp_path, 1, trace_db=setting)
    (tool,) = [s for s in spans if s.name.startswith(attr.SPAN_EXECUTE_TOOL)]
    store = stores.make(setting)
    clock = Clock()
    outgoing = OutgoingSpans(lookup=store.tool_results, lookup_every=5, clock=clock)
    assert outgoing.take([tool]) == []
    call = {"id": tool.attributes[attr.GEN_AI_TOOL_CALL_ID], "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}

    async def second_process():
        async with App(settings_for(qwen3_5_dir, tmp_path, STEPS[1:], trace_db=first.settings.trace_db)) as app:
            messages = [{"role": "user", "content": "Weather and time in Paris?"},
                        {"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": call["id"], "content": RESULTS[0]}]
            status, _ = await app.chat(headers=SESSION, messages=messages, tools=[WEATHER, TIME])
            assert status == 200 and app.telemetry.flush()

    run(second_process())
    clock.now += 4
    assert outgoing.take([]) == []  # not asked again yet
    clock.now += 1
    (found,) = outgoing.take([])
    assert found.attributes[attr.GEN_AI_TOOL_CALL_RESULT] == RESULTS[0]
    assert found.attributes[attr.TOOL_RESULT_TRACE_ID] != format(tool.context.trace_id, "032x")


def test_a_held_span_is_sent_when_due_on_a_quiet_server():
    # No new span arrives to wake the sink: it wakes by itself when the wait is over.
    from opentelemetry.sdk.trace import TracerProvider

    sent = InMemorySpanExporter()
    outgoing = OutgoingSpans(wait=0.2)
    processor = QueueingSpanProcessor(sent, name="otlp", on_dropped=lambda *_: None, outgoing=outgoing)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    span = provider.get_tracer("t").start_span("execute_tool f", attributes={attr.GEN_AI_TOOL_CALL_ID: "call_1"})
    span.end()
    wait_until(sent.get_finished_spans, 10, every=0.02, or_last=True)  # no flush: that would wake the sink
    assert [s.name for s in sent.get_finished_spans()] == ["execute_tool f"]
    assert processor.depth == 0
    provider.shutdown()
