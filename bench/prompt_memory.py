"""What one request of a given size costs the server in memory, and what its trace keeps.

    python bench/prompt_memory.py [--sizes-mb 0.25 0.5 1 2 4 10 50 200]

For each size, a fresh `looptrace serve` (the replay backend with the tiny Qwen3.5 test checkpoint:
the real Qwen3.5 tokenizer and template, 262,144 tokens of context) gets one chat request whose
user message is that many megabytes of this README, repeated (about 3.5 bytes per token). Reported
per size: the answer (200, or the 400 and how its length was found: "at least" is the check before
rendering, families/prompt_length.py), the time to answer, the server's peak RSS above its RSS when
idle (VmHWM, reset after loading, less VmRSS before the request), and the
bytes its trace holds in the store. Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

MB = 1_000_000


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def prompt(size: int) -> str:
    text = (ROOT / "README.md").read_text()
    return (text * (size // len(text) + 1))[:size]


def stored_bytes(path: Path) -> int:
    """The trace's spans and events as stored (the only trace in this store)."""
    with sqlite3.connect(path) as db:
        spans = db.execute("SELECT COALESCE(SUM(LENGTH(attributes) + LENGTH(COALESCE(events, ''))), 0) "
                           "FROM spans").fetchone()[0]
    return spans


def one(checkpoint: str, size_mb: float, logs: Path) -> dict:
    from server import Server

    replay = logs / "steps.jsonl"
    replay.write_text(json.dumps({"text": "Ok.<|im_end|>"}) + "\n")
    server = Server(checkpoint, "--backend", "replay", "--replay", str(replay), "--served-model-name", "m",
                    "--log-level", "warning", log_dir=logs)
    try:
        server.wait_ready(600)
        pid = server.process.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak so far (loading) is forgotten
        idle_kb = status_kb(pid, "VmRSS")
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt(int(size_mb * MB))}],
                           "max_tokens": 4}).encode()
        started = time.perf_counter()
        status, answer = server.request("POST", "/v1/chat/completions", raw=body, timeout=900)
        seconds = time.perf_counter() - started
        peak_kb = status_kb(pid, "VmHWM")
        time.sleep(1.5)  # the store writes a moment after the answer
        message = answer.get("error", {}).get("message", "") if status != 200 else ""
        return {
            "size_mb": size_mb, "status": status, "seconds": round(seconds, 2),
            "found": "before rendering" if "at least" in message else ("rendered" if status == 400 else "-"),
            "peak_over_idle_mb": round((peak_kb - idle_kb) / 1024), "idle_mb": round(idle_kb / 1024),
            "trace_kb": round(stored_bytes(server.trace_db) / 1024, 1),
            "prompt_tokens": answer.get("usage", {}).get("prompt_tokens") if status == 200 else message[:140],
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[0.25, 0.5, 1, 2, 4, 10, 50, 200])
    args = parser.parse_args()
    import tiny_qwen3_5

    checkpoint = str(tiny_qwen3_5.qwen3_5_checkpoint())
    rows = []
    for size in args.sizes_mb:
        rows.append(one(checkpoint, size, Path(tempfile.mkdtemp(prefix="looptrace-prompt-"))))
        r = rows[-1]
        print(f"{r['size_mb']:>7} MB  {r['status']}  {r['found']:<17} {r['seconds']:>6} s  "
              f"peak +{r['peak_over_idle_mb']:>5} MB  trace {r['trace_kb']:>9} kB  {r['prompt_tokens']}", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
