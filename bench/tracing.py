"""What tracing costs: decode speed with tracing on and off, and how fast the trace store absorbs tokens.

    python bench/tracing.py decode [MODEL] [--tokens 256] [--runs 5]
    python bench/tracing.py store [--seconds 10] [--tokens-per-trace 256] [--store S] [--tokens-as-json]
    python bench/tracing.py growth [--traces 200000] [--steps 20] [--tokens 32] [--runs 5] [--store S] [--tokens-as-json]
                                   [--copies N]
    python bench/tracing.py state [--runs 200]

--store picks the store: sqlite (a file of the bench's own) or postgresql (a fresh schema of the tests'
PostgreSQL database, tests/support/postgres.py, or of --postgres-url). --tokens-as-json stores token
events as JSON, as before they were packed (trace_store/packing.py): the "before" of bytes per token.

`decode` runs two `looptrace serve` processes of the same model, one recording every span into the
SQLite store and one with tracing off (--trace-db off: no sink, spans not recorded), and sends them
the same greedy request in turn. `store` feeds requests' spans (a decode span of N token events
each), as the server makes them, into the store's queue and writer as fast as one thread can build
them (pausing while the queue is nine tenths full: what is measured is the store's pace, not its
bound), and reports how fast they were stored, how deep the queue got over time, what was dropped,
and the bytes on disk per request and per token. `growth` writes TRACES requests (conversations of
STEPS, answers of TOKENS tokens) into a store, serves it with a real `looptrace serve` and times
listing and reading it over HTTP (the first page of traces, the 41st through the cursor, a
conversation's traces, sessions, one trace); then retention by size (to half) and by age (to the
newest quarter) on the full store. Token events are a real model's in shape (float32 logprobs, top
fives, tests/support/token_groups.py). `state` times what a turn waits for on either store: a
conversation's last prompt and answer read back (the hot read), and a turn's state written, for
prompts of 1 K, 32 K and 128 K tokens. Each prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]


def bench_decode(model: str, tokens: int, runs: int) -> dict:
    from server import Server

    logs = Path(tempfile.mkdtemp(prefix="looptrace-bench-"))
    # The local backend, as docs/benchmarks.md's figures were measured (a .gguf now gets llama.cpp by
    # default; bench/llama_cpp_decode.py measures tracing there).
    servers = {"on": Server(model, "--backend", "local", "--served-model-name", "m", log_dir=logs),
               "off": Server(model, "--backend", "local", "--served-model-name", "m", "--trace-db", "off",
                             log_dir=logs)}
    try:
        for server in servers.values():
            server.wait_ready(600)
        body = {"model": "m", "messages": PROMPT, "max_tokens": tokens, "temperature": 0}
        for server in servers.values():  # warm-up
            server.post("/v1/chat/completions", {**body, "max_tokens": 8})
        rates: dict[str, list[float]] = {"on": [], "off": []}
        counts: dict[str, set] = {"on": set(), "off": set()}
        for run in range(runs):
            # Interleaved, alternating which goes first, so drift in the machine's speed hits both alike.
            for mode in (("on", "off") if run % 2 == 0 else ("off", "on")):
                started = time.perf_counter()
                status, reply = servers[mode].post("/v1/chat/completions", body, timeout=600)
                seconds = time.perf_counter() - started
                assert status == 200, reply
                n = reply["usage"]["completion_tokens"]
                counts[mode].add(n)
                rates[mode].append(n / seconds)
    finally:
        for server in servers.values():
            server.stop()
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    # Each run's two requests, seconds apart, compared: the machine's drift mostly cancels out.
    pairs = [(b - a) / b * 100 for a, b in zip(rates["on"], rates["off"])]
    return {"model": Path(model).name, "completion_tokens": sorted(counts["on"] | counts["off"]), "runs": runs,
            "tracing_on_tok_s": round(on, 2), "tracing_off_tok_s": round(off, 2),
            "overhead_percent": round(statistics.median(pairs), 2),
            "overhead_percent_range": [round(min(pairs), 2), round(max(pairs), 2)]}


@contextlib.contextmanager
def tokens_as_json(on: bool):
    """Token events stored as JSON, as before they were packed (the "before" of bytes per token)."""
    from looptrace.trace_store import batch, packing

    packing_was = batch.pack

    def refuse(groups):
        raise packing.Unpackable("stored as JSON for comparison")

    if on:
        batch.pack = refuse
    try:
        yield
    finally:
        batch.pack = packing_was


def bench_store(seconds: float, tokens_per_trace: int, kind: str, postgres_url: str | None, as_json: bool) -> dict:
    """Requests' spans, shaped as the server makes them (a server span with its GenAI messages, render
    with the prompt's text and ids, prefill, decode with its token events), fed through the store's
    queue by this thread as fast as it can build them, for SECONDS; then the queue is drained."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from looptrace.trace_store import tokens as token_events
    from looptrace.trace_store.processor import QueueingSpanProcessor
    from looptrace.trace_store.provider import SPAN_LIMITS

    from _stores import BenchStore
    from token_groups import answer

    dropped = [0]
    bench = BenchStore(kind, Path(tempfile.mkdtemp(prefix="looptrace-store-")), postgres_url)
    store = bench.store()
    processor = QueueingSpanProcessor(store, name=kind, on_lost=store.note_lost,
                                      on_dropped=lambda _, n: dropped.__setitem__(0, dropped[0] + n))
    provider = TracerProvider(span_limits=SPAN_LIMITS)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("bench")
    answers = [answer(tokens_per_trace, seed=i) for i in range(16)]
    prompt = "<|im_start|>system\nYou are a coding agent.<|im_end|>\n" + "<|im_start|>user\nFix the parser.<|im_end|>\n" * 20
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Fix the parser."}]}] * 20)
    samples: list[tuple[float, int]] = []
    traces, emitted = 0, 0
    watching = True

    def watch():
        started = time.perf_counter()
        while watching:
            samples.append((round(time.perf_counter() - started, 2), processor.depth))
            time.sleep(0.25)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    with tokens_as_json(as_json):
        while time.perf_counter() - started < seconds:
            while processor.depth > processor.max_queue * 0.9:  # the store's pace, not the queue's bound
                time.sleep(0.001)
            root = tracer.start_span("chat m", attributes={
                "looptrace.endpoint": "chat", "gen_ai.request.model": "m", "gen_ai.conversation.id": f"c{traces % 50}",
                "gen_ai.input.messages": messages, "gen_ai.usage.input_tokens": 400,
                "gen_ai.usage.output_tokens": tokens_per_trace})
            context = trace.set_span_in_context(root)
            tracer.start_span("render", context=context, attributes={
                "looptrace.prompt.text": prompt, "looptrace.prompt.ids": list(range(400))}).end()
            tracer.start_span("prefill", context=context, attributes={"looptrace.prefill.seconds": 0.01}).end()
            decode = tracer.start_span("decode", context=context)
            for group in answers[traces % len(answers)]:
                decode.add_event(token_events.EVENT, group)
            emitted += tokens_per_trace
            decode.end()
            root.end()
            traces += 1
        produced_in = time.perf_counter() - started
        processor.force_flush(600_000)
    written_in = time.perf_counter() - started
    watching = False
    processor.shutdown()
    size, token_bytes = bench.size(), bench.token_bytes()
    bench.drop()
    return {"store": kind, "tokens_as_json": as_json, "requests": traces, "spans": traces * 4, "token_events": emitted,
            "requests_per_second": round(traces / written_in), "spans_per_second": round(traces * 4 / written_in),
            "token_events_per_second": round(emitted / written_in), "produced_in_seconds": round(produced_in, 2),
            "written_in_seconds": round(written_in, 2), "max_queue_depth": max(d for _, d in samples),
            "queue_bound": processor.max_queue, "dropped_spans": dropped[0],
            "bytes_per_request": round(size / max(traces, 1)), "bytes_per_token": round(size / max(emitted, 1), 1),
            "token_event_bytes_per_token": round(token_bytes / max(emitted, 1), 1), "queue_over_time": samples}


def fill_store(store, traces: int, steps: int, tokens: int) -> dict:
    """TRACES requests, STEPS to a conversation, written straight into the store in batches as its
    writer would get them (its own batch writer: export); start times one second apart, oldest first,
    ending now."""
    import random

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

    from looptrace.trace_store import tokens as token_events

    from token_groups import answer

    resource = Resource.create({"service.name": "looptrace"})  # one for all (made per span, it cost more than the store)

    groups = [answer(tokens, seed=i) for i in range(64)]  # a real answer's token events in shape, 64 of them
    prompt = "<|im_start|>user\nFix the parser in src/parse.py.<|im_end|>\n" * 8
    now = time.time_ns()
    batch: list = []
    started = time.perf_counter()
    for i in range(traces):
        trace_id, start = random.getrandbits(128), now - (traces - i) * 10**9
        root = SpanContext(trace_id, random.getrandbits(64), False, TraceFlags(1))

        def child(name: str, attributes: dict, events=(), trace_id=trace_id, root=root, start=start):
            return ReadableSpan(name=name, context=SpanContext(trace_id, random.getrandbits(64), False, TraceFlags(1)),
                                parent=root, attributes=attributes, events=events, kind=SpanKind.INTERNAL,
                                start_time=start, end_time=start + 5 * 10**8, resource=resource)

        batch += [
            child("render", {"looptrace.prompt.text": prompt, "looptrace.prompt.ids": tuple(range(120))}),
            child("prefill", {"looptrace.prefill.seconds": 0.01}),
            child("decode", {"looptrace.decode.seconds": 0.5},
                  [Event(token_events.EVENT, group, start) for group in groups[i % len(groups)]]),
            ReadableSpan(name="chat m", context=root, attributes={
                "looptrace.endpoint": "chat", "gen_ai.request.model": "m", "gen_ai.conversation.id": f"c{i // steps}",
                "gen_ai.usage.input_tokens": 120, "gen_ai.usage.output_tokens": tokens,
                "looptrace.input.new_messages": json.dumps([{"role": "user", "parts": [
                    {"type": "text", "content": f"step {i}: fix the parser"}]}])},
                kind=SpanKind.SERVER, start_time=start, end_time=start + 6 * 10**8, resource=resource)]
        if len(batch) >= 1024:
            store.export(batch)
            batch = []
    store.export(batch)
    seconds = time.perf_counter() - started
    return {"fill_seconds": round(seconds, 1), "traces": traces, "now_ns": now}


def bench_growth(traces: int, steps: int, tokens: int, runs: int, kind: str, postgres_url: str | None,
                 as_json: bool, copies: int = 0) -> dict:
    """A store of TRACES requests (times 1 + COPIES, the copies made by the database: BenchStore.multiply),
    then: how fast a real `looptrace serve` lists and reads it, its size per request and per token, and
    retention by size and by age on it."""
    import tiny_qwen3_5
    from _stores import BenchStore
    from server import Server

    folder = Path(tempfile.mkdtemp(prefix="looptrace-growth-"))
    bench = BenchStore(kind, folder, postgres_url)
    store = bench.store(max_bytes=1 << 45, retention_seconds=1e9)  # a million traces a second apart reach back 11 days
    with tokens_as_json(as_json):
        result = fill_store(store, traces, steps, tokens)
    store.shutdown()
    size = bench.size()
    result.update(store=kind, tokens_as_json=as_json, store_mb=round(size / 2**20, 1),
                  bytes_per_request=round(size / traces), bytes_per_token=round(size / (traces * tokens), 1),
                  token_event_bytes_per_token=round(bench.token_bytes() / (traces * tokens), 1),
                  tokens_per_request=tokens)
    result["filled"] = traces
    if copies:
        result["copied_seconds"] = round(bench.multiply(copies, traces), 1)
        traces *= 1 + copies
        size = bench.size()
        result.update(traces=traces, store_mb_copied=round(size / 2**20, 1))
    replay = folder / "steps.jsonl"
    replay.write_text(json.dumps({"text": "Ok.<|im_end|>"}) + "\n")
    server = Server(str(tiny_qwen3_5.qwen3_5_checkpoint()), "--backend", "replay", "--replay", str(replay),
                    "--trace-db", bench.setting, "--trace-max-mb", str(1 << 20), log_dir=folder)
    try:
        server.wait_ready()
        # A conversation from the middle of the store (of the middle copy, when copied).
        middle = f"c{result['filled'] // steps // 2}" + (f"-{max(1, copies // 2)}" if copies else "")
        result["ms"] = _timed_reads(server, middle, steps, runs)
    finally:
        server.stop()
    result["retention"] = _retention(bench, traces, steps, size, result.pop("now_ns"))
    bench.drop()
    return result


def _timed_reads(server, middle: str, steps: int, runs: int) -> dict:
    """The viewer's and the trace API's reads, over HTTP, each timed RUNS times (interleaved)."""
    _, first = server.get("/v1/traces?limit=50")
    deep = first["next"]
    for _ in range(39):  # the cursor of the 41st page (or the last), walked there page by page
        after = server.get(f"/v1/traces?limit=50&before={deep}")[1]["next"]
        if after is None:
            break
        deep = after
    one = first["data"][0]["trace_id"]
    paths = {"health (no store)": "/health", "traces_first_page": "/v1/traces?limit=50", "traces_page_41": f"/v1/traces?limit=50&before={deep}",
             "conversation_traces": f"/v1/traces?conversation={middle}&limit=1000",
             "sessions_first_page": "/v1/sessions?limit=50", "session_steps": f"/v1/sessions/{middle}",
             "session_search_rare": "/v1/sessions?limit=50&q=step%204321",  # one step's words (and its copies')
             "session_search_common": "/v1/sessions?limit=50&q=fix%20the%20parser",  # every step's words
             "one_trace": f"/v1/traces/{one}", "one_trace_tokens": f"/v1/traces/{one}/tokens",
             "model_filter": "/v1/traces?model=m&limit=50"}
    timings: dict[str, list[float]] = {}
    for _ in range(runs):
        for name, url in paths.items():
            t = time.perf_counter()
            status, body = server.get(url)
            timings.setdefault(name, []).append((time.perf_counter() - t) * 1e3)
            assert status == 200, (url, body)
    assert len(server.get(paths["conversation_traces"])[1]["data"]) == steps
    return {name: {"median": round(statistics.median(v), 1), "max": round(max(v), 1)} for name, v in timings.items()}


def _retention(bench, traces: int, steps: int, size: int, now_ns: int) -> dict:
    """Retention on the full store: by size to half, then by age to the newest quarter. SQLite's size
    is its file's; PostgreSQL's, the stored rows' bytes (it reuses freed space, never shrinking a file)."""
    store = bench.store(retention_seconds=1e9)
    used = size if bench.kind == "sqlite" else int(bench.rows("SELECT sum(bytes) FROM store_usage")[0][0])
    store.max_bytes = used // 2
    t = time.perf_counter()
    store.enforce_retention()
    by_size = time.perf_counter() - t
    left = bench.rows("SELECT count(*) FROM traces")[0][0]
    kept = bench.size() if bench.kind == "sqlite" else int(bench.rows("SELECT sum(bytes) FROM store_usage")[0][0])
    # Start times are a second apart, the newest at `now_ns` (the fill's start).
    store.retention_seconds = (time.time_ns() - now_ns) / 1e9 + traces / 4
    t = time.perf_counter()
    store.enforce_retention()
    by_age = time.perf_counter() - t
    newest = bench.rows("SELECT count(*) FROM traces")[0][0]
    store.shutdown()
    assert kept <= used // 2 + (8 << 20), (kept, used)  # SQLite: the file, not just the rows
    assert abs(newest - traces / 4) <= steps, newest
    return {"by_size_seconds": round(by_size, 2), "traces_left_by_size": left, "mb_after": round(kept / 2**20, 1),
            "by_age_seconds": round(by_age, 2), "traces_left_by_age": newest}


def bench_state(runs: int, postgres_url: str | None) -> dict:
    """What a turn of a conversation waits for, on each store: its last prompt and answer read back
    (`load_turn`, the engine's memory) and its last messages' digests (`load`, observation's: the two
    run at once in the server), and its own state written (`save_turn`, then `save`), in milliseconds
    (median, p99)."""
    from looptrace.trace_store.location import open_state

    from _stores import BenchStore

    result: dict[str, dict] = {}
    for kind in ("sqlite", "postgresql"):
        bench = BenchStore(kind, Path(tempfile.mkdtemp(prefix="looptrace-state-")), postgres_url)
        state = open_state(bench.setting)
        try:
            for length in (1024, 32768, 131072):
                ids, digests = list(range(length)), list(range(-100, 100))
                loads, saves = [], []
                for i in range(runs):  # interleaved: the machine's drift hits both alike
                    t = time.perf_counter()
                    state.save_turn(f"c{i % 8}", ids, length - 64, 0, None, b"\0" * 8 * (len(digests) + 4))
                    state.save(f"c{i % 8}", digests=digests, expected={}, taken=[])
                    saves.append((time.perf_counter() - t) * 1e3)
                    t = time.perf_counter()
                    seen = state.load_turn(f"c{i % 8}")[0]
                    state.load(f"c{i % 8}")
                    loads.append((time.perf_counter() - t) * 1e3)
                    assert len(seen) == length
                pings = []
                for _ in range(runs):  # a round trip that reads nothing: what the machine adds to any
                    t = time.perf_counter()
                    state.count_responses()
                    pings.append((time.perf_counter() - t) * 1e3)
                result[f"{kind}_{length // 1024}k"] = {
                    "empty_query_ms": round(statistics.median(pings), 3),
                    "load_ms": round(statistics.median(loads), 3), "load_p99_ms": round(_p99(loads), 3),
                    "save_ms": round(statistics.median(saves), 3), "save_p99_ms": round(_p99(saves), 3)}
        finally:
            state.close()
            bench.drop()
    return result


def _p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    decode = commands.add_parser("decode")
    decode.add_argument("model", nargs="?")
    decode.add_argument("--tokens", type=int, default=256)
    decode.add_argument("--runs", type=int, default=5)
    store = commands.add_parser("store")
    store.add_argument("--seconds", type=float, default=10)
    store.add_argument("--tokens-per-trace", type=int, default=256)
    growth = commands.add_parser("growth")
    growth.add_argument("--traces", type=int, default=200_000)
    growth.add_argument("--steps", type=int, default=20, help="requests per conversation")
    growth.add_argument("--tokens", type=int, default=32, help="tokens per answer")
    growth.add_argument("--runs", type=int, default=5)
    growth.add_argument("--copies", type=int, default=0,
                        help="then copy the store's rows this many more times, by the database (1 M traces quickly)")
    state = commands.add_parser("state")
    state.add_argument("--runs", type=int, default=200)
    for command in (store, growth, state):
        if command is not state:
            command.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
            command.add_argument("--tokens-as-json", action="store_true", help="token events as JSON, as before packing")
        command.add_argument("--postgres-url", help="a database to make a schema in (default: the tests')")
    args = parser.parse_args()
    if args.command == "growth":
        result = bench_growth(args.traces, args.steps, args.tokens, args.runs, args.store, args.postgres_url,
                              args.tokens_as_json, args.copies)
        print(f"{args.store}: {result['traces']} traces, {result['store_mb']} MB ({result['bytes_per_request']} bytes "
              f"per request, {result['bytes_per_token']} per token, token events {result['token_event_bytes_per_token']} "
              f"per token), filled in {result['fill_seconds']} s")
        for name, figures in result["ms"].items():
            print(f"  {name:22} {figures['median']:7.1f} ms (max {figures['max']})")
        r = result["retention"]
        print(f"  retention by size to half: {r['by_size_seconds']} s, {r['traces_left_by_size']} traces, "
              f"{r['mb_after']} MB; by age to a quarter: {r['by_age_seconds']} s, {r['traces_left_by_age']} traces")
        print(json.dumps({"trace_store_growth": result}))
        return
    if args.command == "state":
        result = bench_state(args.runs, args.postgres_url)
        for name, figures in result.items():
            print(f"  {name:18} load {figures['load_ms']:7.3f} ms (p99 {figures['load_p99_ms']}), "
                  f"save {figures['save_ms']:7.3f} ms (p99 {figures['save_p99_ms']}), an empty query "
                  f"{figures['empty_query_ms']:.3f} ms")
        print(json.dumps({"conversation_state": result}))
        return
    if args.command == "decode":
        from packaged import smollm2_gguf

        result = bench_decode(args.model or str(smollm2_gguf()), args.tokens, args.runs)
        print(f"tracing on {result['tracing_on_tok_s']} tok/s, off {result['tracing_off_tok_s']} tok/s, overhead "
              f"{result['overhead_percent']} % (median of runs; range {result['overhead_percent_range']})")
        print(json.dumps({"tracing_decode": result}))
    else:
        result = bench_store(args.seconds, args.tokens_per_trace, args.store, args.postgres_url, args.tokens_as_json)
        print(f"{args.store}: {result['requests']} requests ({result['spans']} spans, {result['token_events']} token "
              f"events) stored in {result['written_in_seconds']} s: {result['spans_per_second']} spans/s, "
              f"{result['token_events_per_second']} token events/s; queue at most {result['max_queue_depth']} of "
              f"{result['queue_bound']}, {result['dropped_spans']} spans dropped; {result['bytes_per_request']} bytes "
              f"per request, {result['bytes_per_token']} per token ({result['token_event_bytes_per_token']} of them "
              f"token events)")
        print(json.dumps({"trace_store": result}))


if __name__ == "__main__":
    main()
