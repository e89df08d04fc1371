"""What a team's protections add to one request: auth (a store key), its tenant's filter and redaction,
against the same request with all of them off (`--redact off`, no keys). Issue 55's bound: 0.5 ms p50
added to a Chat Completions request carrying 10 KB of new text.

    python bench/tenancy_cost.py [--runs 300] [--kb 10] [--warmup 20] [--split]

Two `looptrace serve` side by side, each on the replay backend (no model time) with the tiny Qwen3.5's
real vocabulary and template and an SQLite store of its own: "on" has a key made in its store (as
`looptrace keys create` makes one, under a key secret both the command and the server are given) and
every request carries it; "off" runs `--redact off` with no keys. Requests alternate between the two,
so a machine's drift falls on both alike. Each is a new conversation whose one user message is KB of
fresh text (a counter in every line: nothing of it was rendered, tokenized or redacted before), with a
few credentials in it, so redaction has work to do; the answer is a short replayed "Done.".

`--split` adds two servers, each with one part on (a key with `--redact off`; redaction with no keys), to
say which part costs what. It reports each server's p50 and p95 request time (client side, in this process) and the p50
difference. Prints one JSON object. Measure on a quiet machine (/work/shared/tools/quiet-run): the
difference is a fraction of a millisecond beside requests of several.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

MODEL = "tiny-qwen"
GOAL_MS = 0.5
SECRET = "bench-tenancy-key-secret"
LINES = ("def handler(request):  # {n}\n    return web.json_response({{'ok': True, 'n': {n}}})\n",
         "-rw-r--r--  1 agent agent 12031 Dec  7 08:00 README-{n}.md\n",
         "LOG_LEVEL=info\nPORT=80{n}\n")


def new_text(kb: int, n: int, rnd: random.Random) -> str:
    """KB of text not seen before, with three credentials (random bodies, assembled here)."""
    alnum = string.ascii_letters + string.digits
    secrets = ["GITHUB_TOKEN=gh" + "p_" + "".join(rnd.choice(alnum) for _ in range(36)) + "\n",
               "AWS_ACCESS_KEY_ID=AK" + "IA" + "".join(rnd.choice(string.ascii_uppercase) for _ in range(16)) + "\n",
               "DB_PASSWORD=" + "".join(rnd.choice(alnum) for _ in range(14)) + "\n"]
    parts, size, line = [], 0, 0
    while size < kb * 1024:
        part = secrets.pop() if secrets and line % 40 == 20 else rnd.choice(LINES).format(n=f"{n}-{line}")
        parts.append(part)
        size, line = size + len(part), line + 1
    return "".join(parts)


def make_key(trace_db: Path) -> str:
    """A key in the store, as `looptrace keys create bench --store …` makes it."""
    import os

    from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore, server_secret
    from looptrace.trace_store.location import open_state

    os.environ[SECRET_ENV] = SECRET
    state = open_state(str(trace_db))
    try:
        return KeyStore(state, server_secret()).create("bench", scopes=("infer",))
    finally:
        state.close()


def timed(server, body: dict, key: str | None) -> float:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    started = time.perf_counter()
    status, answer = server.request("POST", "/v1/chat/completions", body, headers=headers)
    ms = (time.perf_counter() - started) * 1000
    if status != 200:
        raise SystemExit(f"the request failed: {status} {answer}")
    return ms


def figures(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"p50_ms": round(statistics.median(ordered), 3),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300, help="timed requests to each server")
    parser.add_argument("--kb", type=int, default=10, help="KB of new text in each request")
    parser.add_argument("--warmup", type=int, default=20, help="untimed requests to each server first")
    parser.add_argument("--split", action="store_true",
                        help="two servers more, each with one part on: keys alone (--redact off) and redaction alone")
    args = parser.parse_args()

    import tiny_qwen3_5
    from server import Server

    logs = Path(tempfile.mkdtemp(prefix="tenancy-cost-"))
    replay = logs / "replay.jsonl"
    answer = json.dumps({"text": "\n</think>\n\nDone.<|im_end|>"}) + "\n"
    replay.write_text(answer * (args.runs + args.warmup + 1))  # each server reads its own copy
    key = make_key(logs / "on.sqlite3")
    common = (str(tiny_qwen3_5.qwen3_5_checkpoint()), "--backend", "replay", "--replay", str(replay), "--served-model-name", MODEL,
              "--render-check-every", "0")
    servers = {"on": Server(*common, "--trace-db", str(logs / "on.sqlite3"), log_dir=logs,
                            env={"LOOPTRACE_KEY_SECRET": SECRET}),
               "off": Server(*common, "--trace-db", str(logs / "off.sqlite3"), "--redact", "off", log_dir=logs)}
    keys = {"on": key, "off": None}
    if args.split:  # which part costs what: a key in a store of its own, and redaction with no keys
        keyed = make_key(logs / "keys.sqlite3")
        servers["keys"] = Server(*common, "--trace-db", str(logs / "keys.sqlite3"), "--redact", "off", log_dir=logs,
                                 env={"LOOPTRACE_KEY_SECRET": SECRET})
        servers["redact"] = Server(*common, "--trace-db", str(logs / "redact.sqlite3"), log_dir=logs)
        keys.update(keys=keyed, redact=None)
    rnd = random.Random(55)
    times: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for server in servers.values():
            server.wait_ready()
        if servers["on"].request("POST", "/v1/chat/completions", {"model": MODEL, "messages": []})[0] != 401:
            raise SystemExit("the 'on' server answered a request without its key: auth is not on")
        for n in range(args.warmup + args.runs):
            body = {"model": MODEL, "max_tokens": 8, "messages": [
                {"role": "user", "content": new_text(args.kb, n, rnd)}]}
            names = list(servers)
            for name in (names if n % 2 else names[::-1]):  # alternating which goes first
                ms = timed(servers[name], body, keys[name])
                if n >= args.warmup:
                    times[name].append(ms)
    finally:
        for server in servers.values():
            server.stop()
    result = {name: figures(times[name]) for name in servers}
    added = round(result["on"]["p50_ms"] - result["off"]["p50_ms"], 3)
    parts = {f"{name}_added_p50_ms": round(result[name]["p50_ms"] - result["off"]["p50_ms"], 3)
             for name in servers if name not in ("on", "off")}
    print(json.dumps({"args": vars(args), **result, "added_p50_ms": added, **parts, "goal_ms": GOAL_MS,
                      "goal_met": added <= GOAL_MS}))


if __name__ == "__main__":
    main()
