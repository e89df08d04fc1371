"""Does the trace store keep up under load? A real `looptrace serve`, tracing into its store (SQLite,
or PostgreSQL with --store postgresql), driven hard for minutes; every span it made must be stored.

    python bench/trace_load.py replay [--seconds 120] [--streams 16] [--rate 500] [--trace-max-mb MB] [--store S]
                                      [--workers N]
    python bench/trace_load.py vllm   [--seconds 120] [--streams 64] [--tokens 256] [--trace-max-mb MB] [--store S]

--store postgresql writes to a fresh schema of the tests' PostgreSQL database (tests/support/postgres.py:
Debian's cluster, started if stopped), or of --postgres-url.

`replay`: the replay backend (the tiny Qwen3.5 test checkpoint's tokenizer; a short answer, 9
tokens) answering streamed chat requests from STREAMS clients, paced together to RATE requests a
second (each client sends its next request when the previous one is answered and its slot has
come). `vllm`: `--backend vllm` in front of the vLLM test double in --fast mode (no model time),
STREAMS clients each sending streamed requests of TOKENS tokens back to back.

Sampled every second from /metrics: spans waiting in the store's queue, and its bytes. Reported:
requests answered and per second, spans and token events per second, the queue's deepest point and
its bound, how long the store took to catch up after the load ended, the server's CPU, and spans
dropped (`looptrace_trace_spans_dropped_total{sink="sqlite"}`, or `sink="postgresql"`). Checked, failing loudly: every
request answered in full, the store holds exactly one trace per request, each complete (its server
span and every span below it), and nothing was dropped. With --trace-max-mb, retention by size runs
during the load: every trace it left must be whole. Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

from relay import one_stream  # bench/ is on the path only from here

ANSWER = "Sure, here it is.<|im_end|>"
MESSAGES = [{"role": "user", "content": "Say something short."}]


def metric(text: str, name: str, labels: str = "") -> float:
    """One sample's value from a Prometheus text exposition (0 when absent)."""
    prefix = name + ("{" + labels + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(prefix + " "):
            return float(line.split()[-1])
    return 0.0


async def drive(url: str, body: dict, streams: int, seconds: float, rate: float | None,
                watch) -> tuple[list[int], float]:
    """STREAMS clients for SECONDS; paced to RATE requests/s in all when given. Returns each request's
    completion tokens and the wall time."""
    connector = aiohttp.TCPConnector(limit=0)
    tokens: list[int] = []
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        started = time.perf_counter()
        end = started + seconds
        slot = [0]

        async def client() -> None:
            while True:
                if rate:
                    mine = slot[0]
                    slot[0] += 1
                    due = started + mine / rate
                    if due >= end:
                        return
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                elif time.perf_counter() >= end:
                    return
                _, _, usage, _ = await one_stream(session, url + "/v1/chat/completions", body)
                tokens.append(usage or 0)

        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(client() for _ in range(streams)))
        wall = time.perf_counter() - started
        watcher.cancel()
    return tokens, wall


class Store:
    """The store the server writes, read with plain SQL: a SQLite file, or a PostgreSQL schema."""

    def __init__(self, kind: str, folder: Path, postgres_url: str | None) -> None:
        self.kind = kind
        if kind == "sqlite":
            self.setting = str(folder / "traces.sqlite3")
            return
        import postgres  # tests/support: the tests' database, set up if need be

        base = postgres_url or postgres.url()
        self.schema = "load_" + str(int(time.time()))
        import psycopg

        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
        self.setting = f"{base}{'&' if '?' in base else '?'}options={quote(f'-csearch_path={self.schema}', safe='')}"

    def rows(self, sql: str) -> list[tuple]:
        if self.kind == "sqlite":
            with sqlite3.connect(f"file:{self.setting}?mode=ro", uri=True) as db:
                return db.execute(sql).fetchall()
        import psycopg

        with psycopg.connect(self.setting) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]

    def size(self) -> int:
        if self.kind == "sqlite":
            path = Path(self.setting)
            return path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(path.name + "-*"))
        return int(self.rows("SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON "
                             f"n.oid = c.relnamespace WHERE n.nspname = '{self.schema}' AND c.relkind = 'r'")[0][0])


def check_store(store: Store, requests: int, span_names: set[str], retained: bool) -> dict:
    """Every request's trace stored whole (with retention on, every trace retention left); returns
    the store's size figures."""
    concat = "group_concat(name, ',')" if store.kind == "sqlite" else "string_agg(name, ',')"
    traces = store.rows("SELECT count(*) FROM traces")[0][0]
    spans = store.rows("SELECT count(*) FROM spans")[0][0]
    incomplete = store.rows("SELECT count(*) FROM (SELECT DISTINCT trace_id FROM spans) s "
                            "WHERE trace_id NOT IN (SELECT trace_id FROM traces)")[0][0]
    shapes = store.rows(f"SELECT names, count(*) FROM (SELECT trace_id, {concat} AS names FROM "
                        "(SELECT trace_id, name FROM spans ORDER BY name) o GROUP BY trace_id) t GROUP BY names")
    wrong = [(names, n) for names, n in shapes if set(names.split(",")) != span_names]
    if (traces != requests and not retained) or incomplete or wrong:
        raise AssertionError(f"{requests} requests, {traces} traces stored, {incomplete} without their server span, "
                             f"span sets other than {sorted(span_names)}: {wrong[:5]}")
    return {"traces_stored": traces, "spans_stored": spans, "store_mb": round(store.size() / 2**20, 1)}


def run(args: argparse.Namespace) -> dict:
    import tiny_qwen3_5
    from server import Server

    logs = Path(tempfile.mkdtemp(prefix="looptrace-load-"))
    checkpoint = str(tiny_qwen3_5.qwen3_5_checkpoint())
    processes = []
    store = Store(args.store, logs, args.postgres_url)
    sink = f'sink="{args.store}"'
    retention = ["--trace-max-mb", str(args.trace_max_mb)] if args.trace_max_mb else []
    retention += ["--trace-db", store.setting]
    if args.workers > 1:  # processes on one port sharing the store (their /metrics add up: proxy/workers.py)
        retention += ["--workers", str(args.workers)]
    if args.command == "replay":
        steps = int(args.rate * args.seconds * 1.1) + 1000
        replay = logs / "steps.jsonl"
        replay.write_text((json.dumps({"text": ANSWER}) + "\n") * steps)
        server = Server(checkpoint, "--backend", "replay", "--replay", str(replay), "--served-model-name", "m",
                        "--log-level", "warning", *retention, log_dir=logs)
        body = {"model": "m", "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
        span_names = {"chat m", "render", "prefill", "decode"}
    else:
        from _vllm_chat import ChatDoubleProcess

        from processes import free_port

        double = ChatDoubleProcess(checkpoint, port=free_port(), log_path=logs / "double.log", fast=True,
                                   served_model_name="m")
        processes.append(double)
        double.wait_ready()
        server = Server("--backend", "vllm", "--vllm-url", double.url, "--log-level", "warning", *retention,
                        log_dir=logs)
        body = {"model": "m", "messages": MESSAGES, "max_tokens": args.tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "chat_template_kwargs": {"enable_thinking": False}}
        span_names = {"chat m", "render", "prefill", "decode"}
    processes.append(server)
    samples: list[dict] = []
    try:
        server.wait_ready(600)
        import _relay_targets

        cpu_before = _relay_targets.tree_cpu_seconds(server.process.pid)

        async def watch() -> None:
            started = time.perf_counter()
            async with aiohttp.ClientSession() as session:
                while True:
                    async with session.get(server.url + "/metrics") as response:
                        text = await response.text()
                    samples.append({"t": round(time.perf_counter() - started, 1),
                                    "queue_spans": metric(text, "looptrace_trace_queue_spans", sink),
                                    "queue_bytes": metric(text, "looptrace_trace_queue_bytes", sink),
                                    "dropped": metric(text, "looptrace_trace_spans_dropped_total", sink)})
                    await asyncio.sleep(1)

        tokens, wall = asyncio.run(drive(server.url, body, args.streams, args.seconds,
                                         args.rate if args.command == "replay" else None, watch))
        load_cpu = _relay_targets.tree_cpu_seconds(server.process.pid) - cpu_before
        expected = tokens[0] if args.command == "replay" else args.tokens  # the replayed answer's length
        short = [n for n in tokens if n != expected or n == 0]
        if short:
            raise AssertionError(f"{len(short)} answers were not {expected} tokens: {short[:5]}")
        # Caught up: the queue empty and every trace in the file (or, when spans were lost, nothing moving).
        drained, still, last = time.perf_counter(), 0, -1
        while True:
            queued = metric(_metrics(server), "looptrace_trace_queue_spans", sink)
            count = store.rows("SELECT count(*) FROM traces")[0][0]
            still = still + 1 if queued == 0 and count == last else 0
            if (queued == 0 and (count >= len(tokens) or args.trace_max_mb)) or still >= 10:
                break
            last = count
            if time.perf_counter() - drained > 600:
                raise AssertionError("the store did not catch up in 10 minutes")
            time.sleep(0.2)
        drain_seconds = time.perf_counter() - drained
        dropped = metric(_metrics(server), "looptrace_trace_spans_dropped_total", sink)
        try:
            stored, problem = check_store(store, len(tokens), span_names, bool(args.trace_max_mb)), None
        except AssertionError as exc:
            stored, problem = {"spans_stored": store.rows("SELECT count(*) FROM spans")[0][0]}, str(exc)
    finally:
        for process in reversed(processes):
            process.stop()
    spans = stored["spans_stored"]
    result = {
        "mode": args.command, "store": args.store, "streams": args.streams, "trace_max_mb": args.trace_max_mb, "seconds": round(wall, 1), "requests": len(tokens),
        "requests_per_second": round(len(tokens) / wall, 1), "spans_per_second": round(spans / wall),
        "token_events_per_second": round(sum(tokens) / wall), "tokens_per_answer": expected,
        "max_queue_spans": max((s["queue_spans"] for s in samples), default=0),
        "max_queue_mb": round(max((s["queue_bytes"] for s in samples), default=0) / 2**20, 2),
        "drain_seconds": round(drain_seconds, 2), "server_cpu_per_request_ms": round(load_cpu / len(tokens) * 1e3, 3),
        "dropped_spans": int(dropped), **stored, "queue_over_time": samples,
    }
    result["problems"] = [p for p in (problem, f"{int(dropped)} spans dropped" if dropped else None) if p]
    return result


def _metrics(server) -> str:
    import urllib.request

    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        return response.read().decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    replay = commands.add_parser("replay")
    replay.add_argument("--seconds", type=float, default=120)
    replay.add_argument("--streams", type=int, default=16)
    replay.add_argument("--rate", type=float, default=500)
    vllm = commands.add_parser("vllm")
    vllm.add_argument("--seconds", type=float, default=120)
    vllm.add_argument("--streams", type=int, default=64)
    vllm.add_argument("--tokens", type=int, default=256)
    for command in (replay, vllm):
        command.add_argument("--trace-max-mb", type=float, help="the store's size limit: retention runs under load")
        command.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
        command.add_argument("--workers", type=int, default=1, help="server processes on the one port")
        command.add_argument("--postgres-url", help="a PostgreSQL database to make a schema in (default: the tests')")
    args = parser.parse_args()
    result = run(args)
    print(f"{result['mode']} ({result['store']}): {result['requests']} requests in {result['seconds']} s ({result['requests_per_second']}/s, "
          f"{result['spans_per_second']} spans/s, {result['token_events_per_second']} token events/s), queue at most "
          f"{result['max_queue_spans']:.0f} spans / {result['max_queue_mb']} MB, caught up {result['drain_seconds']} s "
          f"after, {result['dropped_spans']} spans dropped, server CPU {result['server_cpu_per_request_ms']} ms/request")
    print(json.dumps({"trace_load": result}))
    if result["problems"]:
        sys.exit("FAILED: " + "; ".join(result["problems"]))


if __name__ == "__main__":
    main()
