"""What looptrace adds in front of a vLLM server: time to first token and tokens/s relayed.

    python bench/relay.py [--tokens 256] [--streams 1 32] [--rounds 4] [--trace-db PATH|off]

Starts the vLLM test double in --fast mode (no model: the same ordinary tokens, sent as fast as
its event loop allows) and `looptrace serve --backend vllm` in front of it, with tracing on (the
SQLite store in a temporary folder) unless told otherwise. At each concurrency level, N clients
each send `--rounds` streamed requests, first straight to the double (the exact body looptrace sent
it, read back from the double's request log), then through looptrace's /v1/chat/completions, so
both paths carry the same prompt and the same tokens. Time to first token is measured to the first
chunk carrying a token (direct) or text (through looptrace). Also reported: looptrace's CPU time per
token relayed, read from /proc. Everything runs on this machine, so the client, the double and
looptrace share its cores. Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

MESSAGES = [{"role": "user", "content": "Tell me about the agent that fixed the parser."}]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def one_stream(session: aiohttp.ClientSession, url: str, body: dict, direct: bool) -> tuple[float, int, float]:
    """(seconds to the first token, tokens, seconds in all) of one streamed request."""
    started = time.perf_counter()
    first, count, buffer = None, 0, b""
    async with session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        async for block in response.content.iter_any():
            lines = (buffer + block).split(b"\n")
            buffer = lines.pop()
            for line in lines:
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if direct:
                    n = sum(len(c.get("token_ids") or ()) for c in chunk.get("choices") or ())
                    count += n
                    has_token = n > 0
                else:
                    if chunk.get("usage"):
                        count = chunk["usage"]["completion_tokens"]
                    delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
                    has_token = bool(delta.get("content") or delta.get("reasoning_content"))
                if has_token and first is None:
                    first = time.perf_counter() - started
    return first if first is not None else float("nan"), count, time.perf_counter() - started


async def level(url: str, body: dict, direct: bool, streams: int, rounds: int) -> dict:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await one_stream(session, url, body, direct)  # warm the connection pool and caches

        async def client() -> list[tuple[float, int, float]]:
            return [await one_stream(session, url, body, direct) for _ in range(rounds)]

        started = time.perf_counter()
        results = [r for per_client in await asyncio.gather(*(client() for _ in range(streams))) for r in per_client]
        wall = time.perf_counter() - started
    ttft = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    return {
        "requests": len(results), "tokens": tokens,
        "ttft_p50_ms": round(statistics.median(ttft) * 1000, 2),
        "ttft_p99_ms": round(ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))] * 1000, 2),
        "tokens_per_s": round(tokens / wall, 1),
        "per_stream_tokens_per_s": round(statistics.median(r[1] / (r[2] - r[0]) for r in results), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=4, help="requests per client at each level")
    parser.add_argument("--trace-db", help="looptrace's --trace-db (default: a store in a temporary folder; 'off')")
    args = parser.parse_args()

    import checkpoints
    from server import Server, free_port
    from vllm_double import DoubleProcess

    logs = Path(tempfile.mkdtemp(prefix="looptrace-relay-"))
    checkpoint = checkpoints.qwen3_5_checkpoint()  # the double reads only its tokenizer in --fast mode
    double = DoubleProcess(checkpoint, port=free_port(), log_path=logs / "double.log", fast=True)
    server = None
    try:
        double.wait_ready()
        trace_db = args.trace_db or str(logs / "traces.sqlite3")
        server = Server("--backend", "vllm", "--vllm-url", double.url, "--trace-db", trace_db, log_dir=logs)
        server.wait_ready(600)
        model = server.get("/health")[1]["model"]
        chat = {"model": model, "messages": MESSAGES, "max_tokens": args.tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "chat_template_kwargs": {"enable_thinking": False}}
        status, reply = server.post("/v1/chat/completions", {**chat, "stream": False})
        assert status == 200 and reply["usage"]["completion_tokens"] == args.tokens, reply
        sent = [r for r in double.requests() if r["body"] and r["outcome"] == "done"][-1]
        direct_url, direct_body = double.url + sent["path"], sent["body"]

        rows = []
        for streams in args.streams:
            direct = asyncio.run(level(direct_url, direct_body, True, streams, args.rounds))
            cpu_before = cpu_seconds(server.process.pid)
            relayed = asyncio.run(level(server.url + "/v1/chat/completions", chat, False, streams, args.rounds))
            cpu = cpu_seconds(server.process.pid) - cpu_before
            relayed["looptrace_cpu_us_per_token"] = round(cpu / relayed["tokens"] * 1e6, 1)
            rows.append({"streams": streams, "direct": direct, "looptrace": relayed,
                         "added_ttft_p50_ms": round(relayed["ttft_p50_ms"] - direct["ttft_p50_ms"], 2),
                         "added_ttft_p99_ms": round(relayed["ttft_p99_ms"] - direct["ttft_p99_ms"], 2)})
    finally:
        if server is not None:
            server.stop()
        double.stop()

    print(f"{'streams':>7} {'path':>9} {'TTFT p50 ms':>11} {'p99 ms':>8} {'tok/s':>9} {'tok/s/stream':>12} "
          f"{'CPU µs/tok':>10}")
    for row in rows:
        for name in ("direct", "looptrace"):
            r = row[name]
            print(f"{row['streams']:>7} {name:>9} {r['ttft_p50_ms']:>11} {r['ttft_p99_ms']:>8} {r['tokens_per_s']:>9} "
                  f"{r['per_stream_tokens_per_s']:>12} {r.get('looptrace_cpu_us_per_token', ''):>10}")
    print(json.dumps({"tokens": args.tokens, "rounds": args.rounds, "route": sent["path"],
                      "tracing": trace_db != "off", "cpus": os.cpu_count(), "levels": rows}))


if __name__ == "__main__":
    main()
