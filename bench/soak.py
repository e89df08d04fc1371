"""Does a server stay well over a long run of mixed traffic? Two real `looptrace serve` processes,
each tracing into its own SQLite store, driven for MINUTES by clients that send valid requests,
invalid ones and requests they walk away from.

    python bench/soak.py [--minutes 30] [--replay-streams 16] [--local-streams 2] [--replay-rate 100] [--seed 1]

`replay`: the replay backend (the tiny Qwen3.5 test checkpoint's tokenizer, a short recorded answer)
with REPLAY_STREAMS clients, paced together to REPLAY_RATE requests a second. `local`: the local
backend decoding the tiny random-weight Qwen3.5 on this machine's CPU, LOCAL_STREAMS clients back to
back, 16 tokens an answer. Each client picks every request at random (seeded) from a fixed mix:

    chat        70 %  a streamed chat completion, read to its end
    responses   10 %  a non-streamed /v1/responses request
    invalid     10 %  one of INVALID: NaN temperature (as raw text), `messages` a string, an unknown
                      model, a negative max_tokens, a body that is not JSON, 17 stop strings
    disconnect  10 %  a streamed chat completion the client closes after its first token

Measured: every request's status by kind, and the server's own count by status
(`looptrace_requests_total`); time to first token of the streamed chats (sent → the first chunk
carrying a token), p50 and p99 in the first and the last five minutes of the run (a sixth of the run
when it is shorter than 30 minutes), and for each minute; each server's resident memory (VmRSS)
every 10 s, beside the local backend's prefix cache (a copied model state per distinct prompt, kept
up to its bound in tokens: memory that grows until the cache is full), and its CPU; the ERROR lines
in each server's log, by exception. At the end, once each store's queue is empty: traces stored
against requests sent, by status and by whether the request reached the model (a decode span), the
span names of each kind of trace, spans without their trace, traces marked as having lost spans,
and `looptrace_trace_spans_dropped_total{sink="sqlite"}`.

Every request that reaches a handler is traced, refused ones included: a refusal is a trace of its
server span alone, with its 4xx (the span is started before the body is read). So the store must
hold one trace per request sent, and a decode span in exactly those sent to the model (valid ones
and disconnects; a disconnect ends as 499 when the server notices the client gone, as 200 when the
whole answer was written first, as the replay's short answers mostly are).

Checked, failing loudly (exit status 1): no 5xx (as the clients saw it or as the server counted
it), no request unanswered, every valid request answered to its end (a streamed chat: a token,
[DONE], no error frame; a response: completed), every invalid one a 4xx in OpenAI's error shape,
one trace per request, no span dropped or lost, both servers alive to the end. Prints a table, then
one JSON object. The stores and logs stay in a temporary folder (printed).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

from trace_load import metric  # bench/ is on the path only from here

MODEL = "m"
ANSWER = "Sure, here it is.<|im_end|>"
LOCAL_TOKENS = 16
MIX = {"chat": 70, "responses": 10, "invalid": 10, "disconnect": 10}
INVALID = ("nan_temperature", "messages_not_array", "unknown_model", "negative_max_tokens", "not_json",
           "too_many_stops")
RSS_EVERY = 10  # seconds between samples of each server's memory and queue
EXAMPLES = 5  # unexpected answers kept, per server, to show what went wrong


@dataclass
class Tally:
    """What one server's clients saw."""

    statuses: dict[str, Counter] = field(default_factory=dict)  # kind → HTTP status → requests (0: no answer)
    unexpected: Counter = field(default_factory=Counter)  # kind → answers that were not what the kind must get
    examples: list[str] = field(default_factory=list)
    ttft: list[tuple[float, float]] = field(default_factory=list)  # (sent, s into the run; its TTFT, s)
    closed_early: int = 0  # disconnects that did close after a token (the others' answers had none)

    def record(self, kind: str, status: int, problem: str | None = None) -> None:
        self.statuses.setdefault(kind, Counter())[status] += 1
        if problem:
            self.unexpected[kind] += 1
            if len(self.examples) < EXAMPLES:
                self.examples.append(f"{kind}: {status}: {problem[:300]}")

    def sent(self, kind: str | None = None) -> int:
        kinds = [kind] if kind else list(self.statuses)
        return sum(sum(self.statuses.get(k, Counter()).values()) for k in kinds)

    def count_5xx(self) -> int:
        return sum(n for counter in self.statuses.values() for status, n in counter.items() if status >= 500)


@dataclass
class Target:
    """One server under load: how to ask it, and what it answered."""

    name: str
    server: object  # tests/support/server.py's Server
    streams: int
    max_tokens: int | None
    rate: float | None  # requests a second over all its clients; None: back to back
    tally: Tally = field(default_factory=Tally)
    samples: list[dict] = field(default_factory=list)
    died: str | None = None


# -- the requests --


def chat_body(tag: int, max_tokens: int | None, stream: bool = True) -> dict:
    # A different prompt each time: the local backend's prefix cache must not make every request free.
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Say something short. ({tag})"}],
            "stream": stream}
    if max_tokens:
        body["max_tokens"] = max_tokens
    return body


def invalid_body(kind: str, tag: int) -> bytes:
    """A request the server must refuse with a 4xx."""
    body = chat_body(tag, None, stream=False)
    if kind == "nan_temperature":  # not JSON, though Python's json module writes and reads it
        return json.dumps(body)[:-1].encode() + b', "temperature": NaN}'
    if kind == "not_json":
        return json.dumps(body)[:20].encode()
    changes = {"messages_not_array": {"messages": "x"}, "unknown_model": {"model": "no-such-model"},
               "negative_max_tokens": {"max_tokens": -1}, "too_many_stops": {"stop": [f"s{i}" for i in range(17)]}}
    return json.dumps({**body, **changes[kind]}).encode()


def token_in(chunk: dict) -> bool:
    """A chat chunk carrying a token the model wrote (text, thinking or a tool call)."""
    delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


async def streamed_chat(session: aiohttp.ClientSession, url: str, body: dict, *,
                        leave: bool) -> tuple[int, float | None, str | None]:
    """A streamed chat read to its end, or with `leave` closed at its first token: (status, time to
    first token, what was wrong)."""
    sent = time.perf_counter()
    ttft, done, buffer = None, False, b""
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            return response.status, None, await response.text()
        async for block in response.content.iter_any():
            lines = (buffer + block).split(b"\n")
            buffer = lines.pop()
            for line in lines:
                if line == b"data: [DONE]":
                    done = True
                elif line.startswith(b"data: {"):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return 200, ttft, f"an error frame: {chunk['error']}"
                    if ttft is None and token_in(chunk):
                        ttft = time.perf_counter() - sent
                        if leave:
                            response.close()  # drops the connection: the server sees the client go
                            return 200, ttft, None
    return 200, ttft, None if done else "the stream ended without [DONE]"


async def responses_request(session: aiohttp.ClientSession, url: str, tag: int,
                            max_tokens: int | None) -> tuple[int, str | None]:
    body = {"model": MODEL, "input": f"Say something short. ({tag})"}
    if max_tokens:
        body["max_output_tokens"] = max_tokens
    async with session.post(url + "/v1/responses", json=body) as response:
        text = await response.text()
    if response.status != 200:
        return response.status, text
    status = json.loads(text).get("status")
    return 200, None if status in ("completed", "incomplete") else f"status {status}: {text}"


async def invalid_request(session: aiohttp.ClientSession, url: str, kind: str, tag: int) -> tuple[int, str | None]:
    async with session.post(url + "/v1/chat/completions", data=invalid_body(kind, tag),
                            headers={"Content-Type": "application/json"}) as response:
        text = await response.text()
    try:
        error = json.loads(text).get("error")
    except (json.JSONDecodeError, AttributeError):
        error = None
    if not 400 <= response.status < 500:
        return response.status, f"{kind} was not refused: {text}"
    if not (isinstance(error, dict) and isinstance(error.get("message"), str)):
        return response.status, f"{kind}: not an OpenAI error body: {text}"
    return response.status, None


async def one_request(session: aiohttp.ClientSession, target: Target, kind: str, rng: random.Random,
                      tag: int, started: float) -> None:
    """Sends one request of `kind` and records what came back."""
    url, tally = target.server.url, target.tally
    sent_at = time.perf_counter() - started
    sub = rng.choice(INVALID) if kind == "invalid" else None
    kind = f"invalid:{sub}" if sub else kind
    try:
        if kind in ("chat", "disconnect"):
            status, ttft, problem = await streamed_chat(session, url, chat_body(tag, target.max_tokens),
                                                        leave=kind == "disconnect")
            if kind == "chat" and ttft is not None:
                tally.ttft.append((sent_at, ttft))
            if kind == "chat" and ttft is None and not problem:
                problem = "an answer without a token"
            if kind == "disconnect" and ttft is not None:
                tally.closed_early += 1
        elif kind == "responses":
            status, problem = await responses_request(session, url, tag, target.max_tokens)
        else:
            status, problem = await invalid_request(session, url, sub, tag)
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError) as exc:
        status, problem = 0, f"{type(exc).__name__}: {exc}"
    tally.record(kind, status, problem)


# -- the load --


async def client(session: aiohttp.ClientSession, target: Target, rng: random.Random, started: float, end: float,
                 slots: list[int], stop: asyncio.Event) -> None:
    """One stream: requests from the mix, one at a time, until the time is up (or a server died)."""
    kinds, weights = list(MIX), list(MIX.values())
    while not stop.is_set():
        if target.rate:  # the target's clients share one pace: the next free slot is this one's
            due = started + slots[0] / target.rate
            slots[0] += 1
            if due >= end:
                return
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
        elif time.perf_counter() >= end:
            return
        tag = slots[1]
        slots[1] += 1
        await one_request(session, target, rng.choices(kinds, weights)[0], rng, tag, started)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def watch(targets: list[Target], started: float, stop: asyncio.Event) -> None:
    """Every RSS_EVERY seconds: each server's memory, its store's queue and its prefix cache. Every
    second: whether each server still runs; one that died stops the run."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for tick in itertools.count():
            for target in targets:
                process = target.server.process
                if process.poll() is not None:
                    target.died = f"exited with {process.returncode} after {time.perf_counter() - started:.0f} s"
                    stop.set()
                    return
                if tick % RSS_EVERY == 0:
                    target.samples.append(await sample(session, target, started))
            await asyncio.sleep(started + tick + 1 - time.perf_counter())


async def sample(session: aiohttp.ClientSession, target: Target, started: float) -> dict:
    found = {"t": round(time.perf_counter() - started, 1), "rss_mb": round(rss_mb(target.server.process.pid), 1)}
    try:
        found.update(await server_state(session, target.server.url))
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError) as exc:
        found["metrics_error"] = f"{type(exc).__name__}: {exc}"
    return found


async def server_state(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    async with session.get(url + "/health") as response:
        health = await response.json()
    state = {"queue_spans": metric(text, "looptrace_trace_queue_spans", 'sink="sqlite"'),
             "dropped": metric(text, "looptrace_trace_spans_dropped_total", 'sink="sqlite"')}
    if "prefix_cache" in health:  # the local backend's kept states: memory that grows until the cache is full
        state["prefix_cache_prompts"] = health["prefix_cache"]["prompts"]
        state["prefix_cache_tokens"] = health["prefix_cache"]["tokens"]
        state["prefix_cache_mb"] = round(health["prefix_cache"].get("bytes", 0) / 1024**2, 1)
    return state


async def drive(targets: list[Target], seconds: float, seed: int) -> float:
    """Every target's clients for SECONDS; returns the wall time."""
    stop = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=300)
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) for _ in targets]
    started = time.perf_counter()
    end = started + seconds
    watcher = asyncio.create_task(watch(targets, started, stop))
    try:
        clients = []
        for number, (target, session) in enumerate(zip(targets, sessions)):
            slots = [0, 0]  # the next pacing slot, the next prompt's tag
            clients += [client(session, target, random.Random(seed * 1000 + number * 100 + i), started, end,
                               slots, stop) for i in range(target.streams)]
        await asyncio.gather(*clients)
    finally:
        wall = time.perf_counter() - started
        watcher.cancel()
        for session in sessions:
            await session.close()
    return wall


# -- the store --


def wait_for_store(target: Target, sent: int, timeout: float = 300) -> float:
    """Seconds until the store has caught up: its queue empty and its trace count still for a second."""
    began, last, still = time.perf_counter(), -1, 0
    while time.perf_counter() - began < timeout:
        queued = metric(fetch_metrics(target.server), "looptrace_trace_queue_spans", 'sink="sqlite"')
        count = query(target.server.trace_db, "SELECT count(*) FROM traces")[0][0]
        still = still + 1 if queued == 0 and count == last else 0
        if queued == 0 and (count >= sent or still >= 5):
            break
        last = count
        time.sleep(0.2)
    return time.perf_counter() - began


def query(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchall()


def fetch_metrics(server) -> str:
    import urllib.request

    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        return response.read().decode()


def served_statuses(text: str) -> dict[str, int]:
    """`looptrace_requests_total` summed by status: the server's own count of how requests ended."""
    statuses: Counter = Counter()
    for line in text.splitlines():
        if line.startswith("looptrace_requests_total{"):
            status = re.search(r'status="(\d+)"', line)
            statuses[status.group(1) if status else "?"] += int(float(line.split()[-1]))
    return dict(sorted(statuses.items()))


def log_errors(log: str) -> dict[str, int]:
    """The server log's ERROR lines, by the exception that ended each traceback (or the line itself)."""
    kinds: Counter = Counter()
    lines = log.splitlines()
    for number, line in enumerate(lines):
        if " ERROR " not in line:
            continue
        ending = next((later for later in lines[number + 1:] if re.match(r"^[\w.]+(Error|Exception)\b", later)), "")
        kinds[ending[:160] or line[:160]] += 1
    return dict(kinds)


def store_figures(path: Path) -> dict:
    """What the store holds: traces by status, which reached the model, spans, and what is incomplete."""
    by_status = query(path, "SELECT http_status, count(*) FROM traces GROUP BY http_status ORDER BY http_status")
    (traces, spans, decoded, orphans, lost), = query(path, """
        SELECT (SELECT count(*) FROM traces), (SELECT count(*) FROM spans),
               (SELECT count(DISTINCT trace_id) FROM spans WHERE name = 'decode'),
               (SELECT count(DISTINCT trace_id) FROM spans WHERE trace_id NOT IN (SELECT trace_id FROM traces)),
               (SELECT count(*) FROM lost_spans)""")
    # The span names of a refused request's trace, and of one that reached the model, by status.
    shapes = query(path, """
        SELECT http_status, names, count(*) FROM (
            SELECT t.http_status, (SELECT group_concat(name, ',') FROM (SELECT name FROM spans s
                                   WHERE s.trace_id = t.trace_id ORDER BY name)) AS names
            FROM traces t) GROUP BY http_status, names ORDER BY http_status, count(*) DESC""")
    size = path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(path.name + "-*"))
    return {"traces": traces, "traces_by_status": {str(s): n for s, n in by_status}, "traces_reaching_model": decoded,
            "spans": spans, "spans_without_trace": orphans, "traces_marked_lost_spans": lost,
            "span_sets": [{"status": s, "spans": names, "traces": n} for s, names, n in shapes],
            "store_mb": round(size / 2**20, 1)}


# -- the figures --


def percentile(values: list[float], p: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def ttft_windows(ttft: list[tuple[float, float]], seconds: float, window: float) -> dict:
    first = [s for at, s in ttft if at < window]
    last = [s for at, s in ttft if at >= seconds - window]
    return {"window_s": round(window, 1), "first": latency(first), "last": latency(last)}


def ttft_by_minute(ttft: list[tuple[float, float]]) -> list[dict]:
    """The same figures for each minute of the run, by when the request was sent: a drift shows here."""
    minutes: dict[int, list[float]] = {}
    for at, s in ttft:
        minutes.setdefault(int(at // 60), []).append(s)
    return [{"minute": m, **latency(values)} for m, values in sorted(minutes.items())]


def latency(seconds: list[float]) -> dict:
    p50, p99 = percentile(seconds, 50), percentile(seconds, 99)
    return {"requests": len(seconds), "p50_ms": p50 and round(p50 * 1e3, 1), "p99_ms": p99 and round(p99 * 1e3, 1)}


def rss_figures(samples: list[dict], window: float) -> dict:
    if not samples:
        return {}
    rss = [(s["t"], s["rss_mb"]) for s in samples]
    at_window = next((mb for t, mb in rss if t >= window), rss[-1][1])
    figures = {"first_mb": rss[0][1], "max_mb": max(mb for _, mb in rss), "last_mb": rss[-1][1],
               "at_window_mb": at_window, "growth_after_window_mb": round(rss[-1][1] - at_window, 1)}
    if "prefix_cache_prompts" in samples[-1]:
        figures["prefix_cache_prompts_at_end"] = samples[-1]["prefix_cache_prompts"]
        figures["prefix_cache_tokens_at_end"] = samples[-1]["prefix_cache_tokens"]
    return figures


def server_figures(target: Target, seconds: float, wall: float, window: float, cpu: float, final: dict) -> dict:
    """One server's figures; `final`: what was read once the load was over (store, metrics)."""
    tally = target.tally
    errors = log_errors(target.server.log())
    return {
        "backend": target.name, "streams": target.streams, "rate": target.rate,
        "requests": tally.sent(), "requests_per_second": round(tally.sent() / min(seconds, wall), 1),
        "by_kind": {k: {str(s): n for s, n in sorted(c.items())} for k, c in sorted(tally.statuses.items())},
        "status_5xx": tally.count_5xx(), "unexpected": dict(tally.unexpected), "examples": tally.examples,
        "disconnects_closed_after_a_token": tally.closed_early,
        "sent_reaching_model": tally.sent("chat") + tally.sent("responses") + tally.sent("disconnect"),
        "sent_invalid": sum(tally.sent(k) for k in tally.statuses if k.startswith("invalid:")),
        "ttft": ttft_windows(tally.ttft, seconds, window), "ttft_by_minute": ttft_by_minute(tally.ttft),
        "rss": rss_figures(target.samples, window), "cpu_percent": None if target.died else round(cpu / wall * 100, 1),
        **final, "log_errors": sum(errors.values()), "log_error_kinds": errors,
        "died": target.died, "samples": target.samples,
    }


def at_end(target: Target) -> dict:
    """Once the store has caught up: what it holds, what it dropped, how the server counted requests."""
    drain = wait_for_store(target, target.tally.sent())
    text = fetch_metrics(target.server)
    return {"store": store_figures(target.server.trace_db),
            "dropped_spans": int(metric(text, "looptrace_trace_spans_dropped_total", 'sink="sqlite"')),
            "drain_seconds": round(drain, 2), "served_statuses": served_statuses(text)}


def problems_of(figures: dict) -> list[str]:
    name = figures["backend"]
    if figures["died"]:  # its store was not read: nothing else can be told
        return [f"{name}: the server {figures['died']}"]
    store, found = figures["store"], []
    if figures["status_5xx"]:
        found.append(f"{name}: {figures['status_5xx']} answers were 5xx")
    if figures["unexpected"]:
        found.append(f"{name}: unexpected answers {figures['unexpected']}: {figures['examples']}")
    served_5xx = sum(n for status, n in figures["served_statuses"].items() if status.startswith("5"))
    if served_5xx:
        found.append(f"{name}: the server counted {served_5xx} requests ending in a 5xx")
    if figures["dropped_spans"]:
        found.append(f"{name}: {figures['dropped_spans']} spans dropped")
    if store["traces"] != figures["requests"]:
        found.append(f"{name}: {figures['requests']} requests sent, {store['traces']} traces stored")
    if store["traces_reaching_model"] != figures["sent_reaching_model"]:
        found.append(f"{name}: {figures['sent_reaching_model']} requests for the model, "
                     f"{store['traces_reaching_model']} traces with a decode span")
    if store["spans_without_trace"] or store["traces_marked_lost_spans"]:
        found.append(f"{name}: {store['spans_without_trace']} traces without their server span, "
                     f"{store['traces_marked_lost_spans']} marked as having lost spans")
    return found


# -- the run --


def start_servers(args: argparse.Namespace, logs: Path) -> list[Target]:
    import tiny_qwen3_5
    from server import Server

    checkpoint = str(tiny_qwen3_5.qwen3_5_checkpoint())
    # One recorded step per request that reaches the model: the pace bounds how many there can be.
    steps = int(args.replay_rate * args.minutes * 60 * 1.1) + 1000
    replay = logs / "steps.jsonl"
    replay.write_text((json.dumps({"text": ANSWER}) + "\n") * steps)
    # The store's size bound past what the run writes (about 1.2 GB at 100 requests a second for 30
    # minutes): retention would otherwise rightly drop the oldest traces, and "one trace per request"
    # could not be checked. The local backend's prefix cache at 512 MB, so that its plateau (each
    # prompt's state is ~1.1 MB here, most of it the last logits over a 248k vocabulary) comes
    # within the run; at the default 2048 MB it comes after ~1,900 prompts.
    common = ("--served-model-name", MODEL, "--log-level", "warning", "--trace-max-mb", "8192")
    targets = []
    if args.replay_streams:
        server = Server(checkpoint, "--backend", "replay", "--replay", str(replay), *common, log_dir=logs)
        targets.append(Target("replay", server, args.replay_streams, None, args.replay_rate))
    if args.local_streams:
        server = Server(checkpoint, "--backend", "local", "--prefix-cache-mb", str(args.prefix_cache_mb), *common,
                        log_dir=logs)
        targets.append(Target("local", server, args.local_streams, LOCAL_TOKENS, None))
    return targets


def run(args: argparse.Namespace) -> dict:
    import _relay_targets

    logs = Path(tempfile.mkdtemp(prefix="looptrace-soak-"))
    targets = start_servers(args, logs)
    try:
        for target in targets:
            target.server.wait_ready(600)
        cpu_before = [_relay_targets.tree_cpu_seconds(t.server.process.pid) for t in targets]
        seconds = args.minutes * 60
        wall = asyncio.run(drive(targets, seconds, args.seed))
        cpu = [_relay_targets.tree_cpu_seconds(t.server.process.pid) - before
               for t, before in zip(targets, cpu_before)]
        window = max(1.0, min(300.0, seconds / 6))
        servers = [server_figures(target, seconds, wall, window, used, {} if target.died else at_end(target))
                   for target, used in zip(targets, cpu)]
    finally:
        for target in targets:
            target.server.stop()
    problems = [p for figures in servers for p in problems_of(figures)]
    return {"minutes": args.minutes, "seconds": seconds, "wall_seconds": round(wall, 1), "seed": args.seed,
            "load_average_at_end": [round(v, 2) for v in os.getloadavg()], "logs": str(logs),
            "servers": servers, "problems": problems}


def print_table(result: dict) -> None:
    print(f"soak: {result['seconds']:.0f} s of load ({result['wall_seconds']} s with the last answers), "
          f"load average at the end {result['load_average_at_end']}, logs and stores in {result['logs']}")
    for s in result["servers"]:
        rss, ttft, store = s["rss"], s["ttft"], s.get("store", {})
        cpu = f", server CPU {s['cpu_percent']} %" if s["cpu_percent"] is not None else ""
        print(f"\n{s['backend']}: {s['streams']} streams, {s['requests']} requests ({s['requests_per_second']}/s){cpu}")
        print(f"  {'kind':<28} statuses")
        for kind, statuses in s["by_kind"].items():
            print(f"  {kind:<28} {', '.join(f'{code}: {n}' for code, n in statuses.items())}")
        print(f"  5xx: {s['status_5xx']}, unexpected: {s['unexpected'] or 0}, disconnects closed after a token: "
              f"{s['disconnects_closed_after_a_token']}; the server's count by status: {s.get('served_statuses')}")
        print(f"  server log: {s['log_errors']} errors")
        for kind, n in s["log_error_kinds"].items():
            print(f"    {n} × {kind}")
        for name in ("first", "last"):
            w = ttft[name]
            figures = f", p50 {w['p50_ms']} ms, p99 {w['p99_ms']} ms" if w["requests"] else ""
            print(f"  TTFT {name} {ttft['window_s']} s: {w['requests']} requests{figures}")
        if rss:
            cache = (f"; the prefix cache held {rss['prefix_cache_prompts_at_end']} prompts, "
                     f"{rss['prefix_cache_tokens_at_end']} tokens" if "prefix_cache_prompts_at_end" in rss else "")
            print(f"  RSS: first {rss['first_mb']} MB, max {rss['max_mb']} MB, last {rss['last_mb']} MB, "
                  f"{rss['growth_after_window_mb']:+} MB since {ttft['window_s']} s{cache}")
        if "spans" in store:
            print(f"  store: {store['traces']} traces for {s['requests']} requests {store['traces_by_status']}, "
                  f"{store['traces_reaching_model']} reached the model (sent: {s['sent_reaching_model']}), "
                  f"{store['spans']} spans, {store['store_mb']} MB; {s['dropped_spans']} dropped, "
                  f"{store['spans_without_trace']} traces without their server span, "
                  f"{store['traces_marked_lost_spans']} marked lost; caught up {s['drain_seconds']} s after")
            for shape in store["span_sets"]:
                print(f"    {shape['status']}: {shape['traces']} traces of [{shape['spans']}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--replay-streams", type=int, default=16)
    parser.add_argument("--local-streams", type=int, default=2)
    parser.add_argument("--replay-rate", type=float, default=100,
                        help="requests a second over all replay streams (bounds the store's growth)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--prefix-cache-mb", type=float, default=512, help="the local server's prefix cache bound")
    args = parser.parse_args()
    if args.replay_rate <= 0:
        parser.error("--replay-rate must be positive: the replay needs a recorded step per request")
    result = run(args)
    print_table(result)
    print(json.dumps({"soak": result}))
    if result["problems"]:
        sys.exit("FAILED: " + "; ".join(result["problems"]))


if __name__ == "__main__":
    main()
