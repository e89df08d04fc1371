"""A conversation over the Responses WebSocket mode: what each turn's render + tokenize costs the
server when the client sends only what the turn adds (`previous_response_id` + new items).

    python bench/websocket_turns.py [--context-files 60] [--turns 12] [--file-lines 60]

`looptrace serve` on the replay backend (no model time) with the tiny Qwen3.5's real vocabulary and
template. A coding agent's session: the first turn carries a system prompt, tools and CONTEXT_FILES
source files (tens of thousands of tokens); each later turn adds one tool result (one more file, about
600 tokens) and the model's next call. It is run twice, each on a socket of its own:

- `websocket`: the openai SDK's `client.responses.connect()`, each later turn `previous_response_id`
  plus its one new item, `store: false` (the socket keeps the conversation);
- `http whole`: `POST /v1/responses` with the whole conversation every turn, to a second server
  started with `--render-cache-mb 0`, which keeps no encoding: every prompt is tokenized whole (what
  every turn cost before the long-session machinery).

Each server first answers one short request, so neither run pays for the first render's warm-up.

Per turn it reports the render span's duration (the template's render and the tokenizing: the
`render` span of each turn's trace), the prompt's tokens, the tokens reused from the lane's previous
encoding, and, for scale, the time to tokenize the turn's added text alone in this process. Prints a
table, then one JSON object. Measure on a quiet machine (/work/shared/tools/quiet-run).
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

from long_session import call_text, source_file  # noqa: E402 - the same agent's files and calls

MODEL = "tiny-qwen"
INSTRUCTIONS = "You are a coding agent. Read files with read_file; keep changes small.\n" * 8
TOOLS = [{"type": "function", "name": "read_file", "description": "Read a file of the repository.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]


def first_input(files: int, lines: int) -> list[dict]:
    context = "\n\n".join(f"# src/context_{i}.py\n{source_file(1000 + i, lines)}" for i in range(files))
    return [{"role": "user", "content": "The totals are wrong. Here is the code:\n\n" + context}]


def added(turn: int, call_id: str, lines: int) -> list[dict]:
    return [{"type": "function_call_output", "call_id": call_id, "output": source_file(turn, lines)}]


def render_span(server, trace_id: str) -> dict:
    deadline = time.monotonic() + 60
    while True:
        status, trace = server.get(f"/v1/traces/{trace_id}")
        if status == 200 and trace.get("complete"):
            span = next(s for s in trace["spans"] if s["name"] == "render")
            return {"ms": span["duration_ms"], **span["attributes"]}
        if time.monotonic() > deadline:
            raise TimeoutError(f"trace {trace_id} not stored")
        time.sleep(0.05)


def over_websocket(server, turns: int, files: int, lines: int) -> list[str]:
    """The session on one socket; the trace id of each turn, in order."""
    import openai

    session = "bench-ws-" + secrets.token_hex(4)
    client = openai.OpenAI(base_url=server.base_url, api_key="none", default_headers={"session_id": session})
    previous, items = None, first_input(files, lines)
    with client.responses.connect() as connection:
        for turn in range(turns):
            body = {"model": MODEL, "input": items, "tools": TOOLS, "instructions": INSTRUCTIONS, "store": False}
            if previous:
                body["previous_response_id"] = previous["id"]
            connection.response.create(**body)
            while (event := json.loads(connection.recv_bytes()))["type"] not in ("response.completed", "error"):
                pass
            assert event["type"] == "response.completed", event
            previous = event["response"]
            call = next(i for i in previous["output"] if i["type"] == "function_call")
            items = added(turn, call["call_id"], lines)
    deadline = time.monotonic() + 60
    while True:
        status, stored = server.get(f"/v1/sessions/{session}")
        if status == 200 and len(stored["steps"]) >= turns:
            return [step["trace_id"] for step in stored["steps"]]
        if time.monotonic() > deadline:
            raise TimeoutError("the session's steps were not stored")
        time.sleep(0.1)


def over_http_whole(server, turns: int, files: int, lines: int) -> list[str]:
    conversation, ids = first_input(files, lines), []
    for turn in range(turns):
        trace_id = secrets.token_hex(16)
        status, answer = server.request("POST", "/v1/responses", {
            "model": MODEL, "input": conversation, "tools": TOOLS, "instructions": INSTRUCTIONS, "store": False},
            headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
        assert status == 200, answer
        ids.append(trace_id)
        call = next(i for i in answer["output"] if i["type"] == "function_call")
        conversation = conversation + answer["output"] + added(turn, call["call_id"], lines)
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context-files", type=int, default=60, help="files in the first turn (about 600 tokens each)")
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--file-lines", type=int, default=60)
    args = parser.parse_args()

    import load_once
    import tiny_qwen3_5
    from server import Server

    model = tiny_qwen3_5.qwen3_5_checkpoint()
    tokenizer = load_once.tokenizer(model)
    logs = Path(tempfile.mkdtemp(prefix="websocket-turns-"))
    replay = logs / "replay.jsonl"
    answer = json.dumps({"text": "\n</think>\n\n" + call_text(0)})
    replay.write_text((answer + "\n") * (args.turns + 1))  # each server: a warm-up, then the turns
    common = ("--backend", "replay", "--replay", str(replay), "--served-model-name", MODEL, "--render-check-every", "0")
    servers = {"websocket": Server(model, *common, log_dir=logs),
               "http whole": Server(model, *common, "--render-cache-mb", "0", log_dir=logs)}
    try:
        for server in servers.values():
            server.wait_ready()
            server.request("POST", "/v1/responses", {"model": MODEL, "input": "warm up", "tools": TOOLS})
        runs = {"websocket": over_websocket(servers["websocket"], args.turns, args.context_files, args.file_lines),
                "http whole": over_http_whole(servers["http whole"], args.turns, args.context_files,
                                              args.file_lines)}
        spans = {name: [render_span(servers[name], t) for t in ids] for name, ids in runs.items()}
    finally:
        for server in servers.values():
            server.stop()
    alone = []
    for turn in range(args.turns):
        text = source_file(turn, args.file_lines)
        started = time.perf_counter()
        tokenizer.encode(text, add_special_tokens=False)
        alone.append((time.perf_counter() - started) * 1000)
    rows = []
    for turn in range(args.turns):
        ws, whole = spans["websocket"][turn], spans["http whole"][turn]
        rows.append({"turn": turn + 1, "prompt_tokens": ws.get("looptrace.prompt.tokens"),
                     "reused_tokens": ws.get("looptrace.prompt.reused_tokens", 0),
                     "websocket_render_ms": round(ws["ms"], 2), "http_whole_render_ms": round(whole["ms"], 2),
                     "added_alone_tokenize_ms": round(alone[turn], 2)})
    print(f"{'turn':>4} {'prompt':>8} {'reused':>8} {'websocket ms':>13} {'http whole ms':>14} {'added alone ms':>15}")
    for row in rows:
        print(f"{row['turn']:>4} {row['prompt_tokens']:>8} {row['reused_tokens']:>8} {row['websocket_render_ms']:>13} "
              f"{row['http_whole_render_ms']:>14} {row['added_alone_tokenize_ms']:>15}")
    later = rows[1:]
    summary = {name: statistics.median(r[key] for r in later) for name, key in (
        ("websocket_later_turns_median_ms", "websocket_render_ms"),
        ("http_whole_later_turns_median_ms", "http_whole_render_ms"),
        ("added_alone_median_ms", "added_alone_tokenize_ms"))} if later else {}
    print(json.dumps({"args": vars(args), "turns": rows, "summary": summary}))


if __name__ == "__main__":
    main()
