"""What token continuity adds to a turn: `--token-continuity off`, `check` and `keep` side by side.

    python bench/rollouts.py [--turns 128] [--at 8 32 128] [--window 4] [--file-lines 60]

Three `looptrace serve` processes on the replay backend (no model time: every millisecond is
looptrace's own) with the tiny Qwen3.5's real vocabulary and template, one per mode, each driven
through the same scripted coding agent as bench/long_session.py (a system prompt and tools, a task,
then a tool loop reading one more source file a turn, about 600 tokens), every turn through a
rollout's base URL (`/r/{id}/v1`), the three interleaved and the order rotated each turn so that the
machine's drift falls on all alike. Each turn's wall time is looptrace's cost of it. Reported, around
each of AT turns (the WINDOW turns up to it): each mode's median and p95, and what check and keep add
to off at the median (the goal: at most 5 ms at 128 turns). Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

from long_session import SYSTEM, TASK, TOOLS, call_text, get, post, source_file  # noqa: E402

MODES = ("off", "check", "keep")


class Server:
    """One `looptrace serve` on the replay backend in one continuity mode, with a store of its own."""

    def __init__(self, mode: str, model: str, replay: Path, logs: Path) -> None:
        from processes import Service, free_port

        self.mode, self.port = mode, free_port()
        command = [sys.executable, "-m", "looptrace.proxy.cli", "serve", model, "--backend", "replay", "--replay",
                   str(replay), "--served-model-name", "m", "--max-model-len", "400000", "--port", str(self.port),
                   "--trace-db", str(logs / f"{mode}.sqlite3"), "--token-continuity", mode]
        self.service = Service(command, logs / f"{mode}.log", cwd=ROOT)
        self.service.name = f"looptrace ({mode})"
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        def ready() -> bool:
            try:
                return get(self.url + "/health", timeout=5)[0].get("status") == "ready"
            except OSError:
                return False

        self.service.wait_until(ready, 300)


def run(servers: list[Server], turns: int, lines: int) -> dict[str, list[float]]:
    """The session on every server; each mode's milliseconds per turn."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    times: dict[str, list[float]] = {s.mode: [] for s in servers}
    for turn in range(turns):
        body = {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 200,
                "chat_template_kwargs": {"enable_thinking": False}}
        order = servers[turn % len(servers):] + servers[:turn % len(servers)]
        calls = None
        for server in order:
            reply, seconds = post(f"{server.url}/r/bench/v1/chat/completions", body)
            times[server.mode].append(seconds * 1000)
            calls = calls or reply["choices"][0]["message"].get("tool_calls")
        assert calls and calls[0]["function"]["name"] == "read_file", calls
        messages = [*messages, {"role": "assistant", "content": None, "tool_calls": calls[:1]},
                    {"role": "tool", "tool_call_id": calls[0]["id"], "content": source_file(turn, lines)}]
    return times


def figures(times: dict[str, list[float]], at: list[int], window: int) -> list[dict]:
    rows = []
    for turn in at:
        if turn > len(times["off"]):
            continue
        cut = {mode: values[max(0, turn - window):turn] for mode, values in times.items()}
        row = {"turns": turn}
        for mode, values in cut.items():
            row[f"{mode}_p50_ms"] = statistics.median(values)
            row[f"{mode}_p95_ms"] = sorted(values)[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
        for mode in ("check", "keep"):
            row[f"{mode}_added_p50_ms"] = row[f"{mode}_p50_ms"] - row["off_p50_ms"]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=128)
    parser.add_argument("--at", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--window", type=int, default=4, help="turns up to each point that its figures are of")
    parser.add_argument("--file-lines", type=int, default=60, help="lines of each source file the tool returns")
    args = parser.parse_args()
    from tiny_qwen3_5 import qwen3_5_checkpoint

    model = str(qwen3_5_checkpoint())
    with tempfile.TemporaryDirectory() as folder:
        logs = Path(folder)
        replay = logs / "steps.jsonl"
        replay.write_text("".join(json.dumps({"text": call_text(t)}) + "\n" for t in range(args.turns)))
        servers = [Server(mode, model, replay, logs) for mode in MODES]
        try:
            for server in servers:
                server.wait_ready()
            rows = figures(run(servers, args.turns, args.file_lines), args.at, args.window)
        finally:
            for server in servers:
                server.service.stop()
    print(f"{'turns':>6} " + " ".join(f"{m + ' p50':>10} {m + ' p95':>10}" for m in MODES)
          + f" {'check +':>9} {'keep +':>9}")
    for row in rows:
        print(f"{row['turns']:>6} " + " ".join(f"{row[m + '_p50_ms']:>10.1f} {row[m + '_p95_ms']:>10.1f}" for m in MODES)
              + f" {row['check_added_p50_ms']:>9.1f} {row['keep_added_p50_ms']:>9.1f}")
    print(json.dumps({"benchmark": "rollouts", "turns": args.turns, "window": args.window, "rows": rows}))


if __name__ == "__main__":
    main()
