"""What tracing costs: decode speed with tracing on and off, and how fast the trace store absorbs tokens.

    python bench/tracing.py decode [MODEL] [--tokens 256] [--runs 5]
    python bench/tracing.py store [--seconds 10] [--tokens-per-trace 4000]

`decode` runs two `looptrace serve` processes of the same model, one recording every span into the
SQLite store and one with tracing off (--trace-db off: no sink, spans not recorded), and sends them
the same greedy request in turn. `store` feeds decode spans of N token events, as the server makes
them, into the store's queue and writer as fast as one thread can build them, and reports what it
wrote, how deep the queue got and what it dropped. Each prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]


def bench_decode(model: str, tokens: int, runs: int) -> dict:
    from server import Server

    logs = Path(tempfile.mkdtemp(prefix="looptrace-bench-"))
    servers = {"on": Server(model, "--served-model-name", "m", log_dir=logs),
               "off": Server(model, "--served-model-name", "m", "--trace-db", "off", log_dir=logs)}
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


def bench_store(seconds: float, tokens_per_trace: int) -> dict:
    from opentelemetry.sdk.trace import TracerProvider

    from looptrace.trace_store import tokens as token_events
    from looptrace.trace_store.processor import QueueingSpanProcessor
    from looptrace.trace_store.setup import SPAN_LIMITS
    from looptrace.trace_store.sqlite import SQLiteTraceStore

    dropped = [0]
    folder = Path(tempfile.mkdtemp(prefix="looptrace-store-"))
    store = SQLiteTraceStore(folder / "traces.sqlite3")
    processor = QueueingSpanProcessor(store, name="sqlite", on_dropped=lambda _, n: dropped.__setitem__(0, dropped[0] + n))
    provider = TracerProvider(span_limits=SPAN_LIMITS)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("bench")
    group = {token_events.PREFIX + name: values for name, values in {
        "index": list(range(token_events.GROUP)), "time_unix_nano": [time.time_ns()] * token_events.GROUP,
        "id": [1234] * token_events.GROUP, "piece": ["Ġword"] * token_events.GROUP,
        "text": [" word"] * token_events.GROUP, "special": [False] * token_events.GROUP,
        "channel": ["content"] * token_events.GROUP, "p": [0.5] * token_events.GROUP,
        "logprob": [-0.69] * token_events.GROUP, "rank": [1] * token_events.GROUP,
        "top_ids": [1, 2, 3, 4, 5] * token_events.GROUP, "top_pieces": ["a", "b", "c", "d", "e"] * token_events.GROUP,
        "top_p": [0.5, 0.2, 0.1, 0.1, 0.05] * token_events.GROUP, "drafted": [0] * token_events.GROUP,
        "accepted": [0] * token_events.GROUP}.items()}
    max_depth, traces, emitted = 0, 0, 0
    watching = True

    def watch():
        nonlocal max_depth
        while watching:
            max_depth = max(max_depth, processor.depth)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        root = tracer.start_span("chat m", attributes={"looptrace.endpoint": "chat", "gen_ai.request.model": "m"})
        decode = tracer.start_span("decode")
        for _ in range(tokens_per_trace // token_events.GROUP):
            decode.add_event(token_events.EVENT, group)
            emitted += token_events.GROUP
        decode.end()
        root.end()
        traces += 1
    produced_in = time.perf_counter() - started
    processor.force_flush(600_000)
    written_in = time.perf_counter() - started
    watching = False
    processor.shutdown()
    size = (folder / "traces.sqlite3").stat().st_size
    return {"traces": traces, "token_events": emitted, "produced_per_second": round(emitted / produced_in),
            "written_per_second": round(emitted / written_in), "max_queue_depth": max_depth,
            "queue_bound": processor._queue.maxsize, "dropped_spans": dropped[0],
            "bytes_per_token": round(size / max(emitted, 1), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    decode = commands.add_parser("decode")
    decode.add_argument("model", nargs="?")
    decode.add_argument("--tokens", type=int, default=256)
    decode.add_argument("--runs", type=int, default=5)
    store = commands.add_parser("store")
    store.add_argument("--seconds", type=float, default=10)
    store.add_argument("--tokens-per-trace", type=int, default=4000)
    args = parser.parse_args()
    if args.command == "decode":
        from packaged import smollm2_gguf

        result = bench_decode(args.model or str(smollm2_gguf()), args.tokens, args.runs)
        print(f"tracing on {result['tracing_on_tok_s']} tok/s, off {result['tracing_off_tok_s']} tok/s, overhead "
              f"{result['overhead_percent']} % (median of runs; range {result['overhead_percent_range']})")
        print(json.dumps({"tracing_decode": result}))
    else:
        result = bench_store(args.seconds, args.tokens_per_trace)
        print(f"{result['token_events']} token events in {result['traces']} traces: produced "
              f"{result['produced_per_second']}/s, written {result['written_per_second']}/s, max queue depth "
              f"{result['max_queue_depth']} of {result['queue_bound']}, dropped {result['dropped_spans']} spans")
        print(json.dumps({"trace_store": result}))


if __name__ == "__main__":
    main()
