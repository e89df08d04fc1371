"""A chat's time to first token while the trace viewer searches: does serving wait for the viewer?

    python bench/search_load.py [--traces 3000] [--rounds 7]

A real `looptrace serve` (the replay backend with the tiny Qwen3.5 test checkpoint) with a store of
--traces requests, each with words of its own in its prompt (the full-text index has something to
search). Then, in interleaved rounds, a chat's time to first token (streamed, to its first delta) is
measured five times in each condition: alone; while eight clients search `/v1/sessions?q=` with a
60 KB phrase, back to back; and while eight search with the longest phrase the server takes (256
characters, 16 words, issue 31). Two chats: a short one (rendered on the event loop) and one of 20 KB
(rendered on a thread). Reported per condition: the median, the 10th and 90th percentiles, and the
searches' own answers (status, median seconds). To measure another tree, run this file with a Python
whose `looptrace` is that tree. Prints a table, then JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

WORDS = [f"w{i:04d}" for i in range(5000)]


def post(url: str, body: dict, headers: dict | None = None) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()
        return response.status


def first_token(url: str, text: str) -> float:
    """Seconds from sending a streamed chat to its first delta."""
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4, "stream": True}
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            if line.startswith(b"data: {") and b'"delta"' in line and (b'"content"' in line or b'"reasoning' in line):
                seconds = time.perf_counter() - started
                response.read()
                return seconds
    raise RuntimeError("no token")


def search(url: str, phrase: str) -> tuple[int, float]:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url + "/v1/sessions?" + urllib.parse.urlencode({"q": phrase}), timeout=600) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as err:
        err.read()
        status = err.code
    return status, time.perf_counter() - started


class Searching:
    """Eight clients searching back to back until stopped."""

    def __init__(self, url: str, phrase: str | None) -> None:
        self.url, self.phrase, self.stop = url, phrase, threading.Event()
        self.answers: list[tuple[int, float]] = []
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(8 if phrase else 0)]

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.answers.append(search(self.url, self.phrase))

    def __enter__(self) -> "Searching":
        for t in self.threads:
            t.start()
        time.sleep(0.5 if self.threads else 0)  # the searches are under way
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(900)


def summary(values: list[float]) -> dict:
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"median_ms": round(statistics.median(values) * 1000, 1), "p10_ms": round(pick(0.1) * 1000, 1),
            "p90_ms": round(pick(0.9) * 1000, 1), "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import tiny_qwen3_5
    from server import Server

    logs = Path(tempfile.mkdtemp(prefix="looptrace-search-"))
    replay = logs / "steps.jsonl"
    step = json.dumps({"text": "Ok, noted.<|im_end|>"}) + "\n"  # one per request
    replay.write_text(step * (args.traces + args.rounds * 200 + 100))
    server = Server(str(tiny_qwen3_5.qwen3_5_checkpoint()), "--backend", "replay", "--replay", str(replay),
                    "--served-model-name", "m", "--log-level", "warning", log_dir=logs)
    server.wait_ready(600)
    url = server.url
    try:
        rng = random.Random(7)
        with ThreadPoolExecutor(8) as pool:  # the store: sessions of 10 steps, each with words of its own
            list(pool.map(lambda i: post(url + "/v1/chat/completions", {"model": "m", "max_tokens": 4, "messages": [
                {"role": "user", "content": " ".join(rng.choices(WORDS, k=60))}]}, {"session_id": f"s{i // 10}"}),
                range(args.traces)))
        time.sleep(3)  # stored
        long_phrase = " ".join(WORDS[i % len(WORDS)] for i in range(60_000 // 6))[:60_000]
        longest_taken = " ".join(WORDS[:16])[:256]
        conditions = {"alone": None, "eight 60 KB searches": long_phrase,
                      "eight searches of 16 words": longest_taken}
        chats = {"short chat": "What is the capital of France?", "20 KB chat": "word " * 4_000}
        ttft = {(c, k): [] for c in conditions for k in chats}
        searches: dict[str, list] = {c: [] for c in conditions}
        for _ in range(args.rounds):
            for condition, phrase in conditions.items():
                with Searching(url, phrase) as running:
                    for chat, text in chats.items():
                        ttft[(condition, chat)] += [first_token(url, text) for _ in range(5)]
                searches[condition] += running.answers
        rows = []
        for (condition, chat), values in ttft.items():
            answered = searches[condition]
            rows.append({"condition": condition, "chat": chat, **summary(values),
                         "search_status": sorted({s for s, _ in answered}),
                         "search_median_s": round(statistics.median([t for _, t in answered]), 3) if answered else None,
                         "searches": len(answered)})
            r = rows[-1]
            print(f"{condition:<28} {chat:<11} TTFT median {r['median_ms']:>8} ms  p10 {r['p10_ms']:>8}  "
                  f"p90 {r['p90_ms']:>8}  searches {r['searches']:>4} {r['search_status']} "
                  f"median {r['search_median_s']} s", flush=True)
        print(json.dumps(rows))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
