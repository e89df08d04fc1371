"""What redaction costs a request: 10 KB of new text (code, a shell's output, an env file's lines), with
no secret and with five, through what the tracer runs on a turn's new text (common/redaction.py's
`redact`, keep_length as a prompt's is), and the same text inside the messages' JSON. Issue 55's bound
for auth, tenant filter and redaction together: 0.5 ms p50 beside the same request with them off.

    python bench/redaction.py [--runs 2000] [--kb 10]

The "off" line is what the request does with `--redact off`: nothing (the text is recorded as it is),
timed the same way so the difference is the cost. Each run redacts a fresh string (a counter appended),
so no cache of a secret's marker hides the hashing of a new one.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import time

from looptrace.common.redaction import Redactor

LINES = [
    "def handler(request):\n    body = await request.json()\n    return web.json_response({'ok': True})\n",
    "drwxr-xr-x  5 agent agent  4096 Dec  7 08:00 src\n-rw-r--r--  1 agent agent 12031 Dec  7 08:00 README.md\n",
    "LOG_LEVEL=info\nPORT=8080\nSORT_KEY=created_at\nFEATURE_FLAGS=search,compare\n",
    "commit 3f9a1c0b6e2d4f8a9b7c5d3e1f0a2b4c6d8e0f1a\nAuthor: A Person <a@example.com>\n\n    Fix the cut\n",
    "for (let i = 0; i < items.length; i++) { total += items[i].price * items[i].count; }\n",
]


def secrets(rnd: random.Random) -> list[str]:
    alnum = string.ascii_letters + string.digits

    def r(n: int) -> str:
        return "".join(rnd.choice(alnum) for _ in range(n))
    return ["GITHUB_TOKEN=gh" + "p_" + r(36) + "\n", "AWS_ACCESS_KEY_ID=AK" + "IA" + r(16).upper() + "\n",
            "OPENAI_API_KEY=sk-" + "proj-" + r(48) + "\n", "DB_PASSWORD=" + r(14) + "\n",
            "-----BEGIN " + "PRIVATE KEY-----\n" + "\n".join(r(64) for _ in range(4)) + "\n-----END PRIVATE KEY-----\n"]


def text(kb: int, with_secrets: bool, rnd: random.Random) -> str:
    parts, size = [], 0
    found = secrets(rnd) if with_secrets else []
    while size < kb * 1024:
        part = rnd.choice(LINES)
        if found and rnd.random() < 0.05:
            part = found.pop()
        parts.append(part)
        size += len(part)
    return "".join(parts + found)


def timed(fn, inputs: list[str]) -> list[float]:
    times = []
    for value in inputs:
        start = time.perf_counter_ns()
        fn(value)
        times.append((time.perf_counter_ns() - start) / 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--kb", type=int, default=10)
    args = parser.parse_args()
    rnd = random.Random(55)
    redactor = Redactor(b"bench key")
    for with_secrets in (False, True):
        inputs = [text(args.kb, with_secrets, rnd) + f"\n#{i}" for i in range(args.runs)]
        as_json = [json.dumps([{"role": "user", "content": t}]) for t in inputs]
        off = timed(lambda t: t, inputs)
        prompt = timed(lambda t: redactor.redact(t, keep_length=True), inputs)
        messages = timed(redactor.redact, as_json)
        label = "5 secrets" if with_secrets else "no secret"
        found = len(redactor.find(inputs[0]))
        for name, times in (("off", off), ("prompt text", prompt), ("messages JSON", messages)):
            print(f"{args.kb} KB, {label} ({found} found): {name:14s} p50 {statistics.median(times):8.1f} µs   "
                  f"p99 {statistics.quantiles(times, n=100)[98]:8.1f} µs")


if __name__ == "__main__":
    main()
