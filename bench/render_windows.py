"""A long tool-calling session per family, its chat template rendered from windows and whole, side by side.

    python bench/render_windows.py [--families qwen3_5 gemma4 chatml] [--turns 150] [--tokens 126000]
                                   [--check-every 10] [--before PYTHON]

For each family's real template (the tiny Qwen3.5 and Gemma 4 the tests build, SmolLM2's GGUF for
ChatML), two `looptrace serve` on the replay backend (no model time: every millisecond is
looptrace's own): one as it ships, one with `--no-render-windows`. A scripted agent (system prompt,
tools, a task, then one file read per turn, sized so that the session reaches TOKENS prompt tokens
at TURNS turns) sends every turn to both, as a non-streamed Chat Completions request carrying the
whole conversation, alternating which goes first. Reported per server: the p50 of the early turns
(11 to 30) and of the last 20, their ratio, the last prompt's tokens, and from /metrics the turns
rendered by window, whole or fallback and the drift counter (`--check-every` sets
`--render-check-every`, so that sampled whole renderings are there to contradict a window).
With `--before PYTHON` a third server, as it ships but run by another interpreter (one that imports
an older looptrace), gets every turn too: before and after side by side, on the same load.

Prints a table and then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from long_session import SYSTEM, TASK, TOOLS, Target, post, source_file  # noqa: E402

EARLY, LATE = slice(10, 30), slice(-20, None)
Q = '<|"|>'  # Gemma 4's string delimiter token


def call_text(family: str, turn: int) -> str:
    """The model's answer at `turn`, a read_file call in the family's own markup."""
    path = f"src/module_{turn}.py"
    if family == "qwen3_5":
        return f"<tool_call>\n<function=read_file>\n<parameter=path>\n{path}\n</parameter>\n</function>\n</tool_call><|im_end|>"
    if family == "gemma4":
        return f"<|tool_call>call:read_file{{path:{Q}{path}{Q}}}<tool_call|><|tool_response>"
    return f'<tool_call>\n{{"name": "read_file", "arguments": {{"path": "{path}"}}}}\n</tool_call><|im_end|>'


def checkpoint(family: str) -> str:
    if family == "qwen3_5":
        import tiny_qwen3_5

        return str(tiny_qwen3_5.qwen3_5_checkpoint())
    if family == "gemma4":
        import tiny_gemma4

        return str(tiny_gemma4.gemma4_checkpoint())
    import packaged

    return str(packaged.smollm2_gguf())


def render_metrics(url: str) -> dict:
    """The turns by how their template text was rendered, and the drift counter, from /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    found = {"window": 0, "whole": 0, "fallback": 0, "drift": 0}
    for how, value in re.findall(r'^looptrace_render_windows_total\{[^}]*how="(\w+)"[^}]*\} (\S+)$', text, re.M):
        found[how] = int(float(value))
    found["drift"] = sum(int(float(v)) for v in re.findall(r"^looptrace_render_drift_total\{[^}]*\} (\S+)$", text, re.M))
    return found


def run_family(family: str, args: argparse.Namespace, logs: Path) -> dict:
    replay = logs / f"{family}.jsonl"
    replay.write_text("".join(json.dumps({"text": call_text(family, t)}) + "\n" for t in range(args.turns)))
    model = checkpoint(family)
    checks = ("--render-check-every", str(args.check_every))
    targets = [Target(f"{family}-windows", sys.executable, model, replay, logs, checks),
               Target(f"{family}-whole", sys.executable, model, replay, logs, (*checks, "--no-render-windows"))]
    if args.before:
        targets.append(Target(f"{family}-before", args.before, model, replay, logs, checks))
    times: dict[str, list[float]] = {t.name: [] for t in targets}
    tokens = {t.name: 0 for t in targets}
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    lines, measured = 40, None
    try:
        for target in targets:
            target.wait_ready()
        for turn in range(args.turns):
            body = {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 200,
                    "chat_template_kwargs": {"enable_thinking": False}}
            for target in (targets if turn % 2 == 0 else targets[::-1]):
                try:
                    reply, seconds = post(target.url + "/v1/chat/completions", body, {"session_id": "long"})
                except urllib.error.HTTPError as exc:  # the server's own words, not urllib's
                    raise SystemExit(f"{target.name}, turn {turn + 1}: {exc.code} {exc.read().decode()[:500]}")
                times[target.name].append(seconds * 1000)
                tokens[target.name] = reply["usage"]["prompt_tokens"]
            calls = reply["choices"][0]["message"].get("tool_calls")
            assert calls, reply["choices"][0]["message"]
            if turn == 2:  # a file's tokens a line, now known: the rest sized to reach TOKENS at TURNS
                per_line = (tokens[targets[0].name] - measured) / lines
                lines = max(4, int((args.tokens - tokens[targets[0].name]) / max(1, args.turns - 3) / per_line))
            measured = tokens[targets[0].name]
            messages = [*messages, {"role": "assistant", "content": "", "tool_calls": calls},
                        {"role": "tool", "tool_call_id": calls[0]["id"], "content": source_file(turn, lines)}]
        return {t.name: summary(times[t.name], tokens[t.name], render_metrics(t.url)) for t in targets}
    finally:
        for target in targets:
            target.stop()


def summary(ms: list[float], tokens: int, metrics: dict) -> dict:
    early, late = statistics.median(ms[EARLY]), statistics.median(ms[LATE])
    return {"early_p50_ms": round(early, 1), "late_p50_ms": round(late, 1), "late_over_early": round(late / early, 2),
            "last_prompt_tokens": tokens, **metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["qwen3_5", "gemma4", "chatml"],
                        choices=["qwen3_5", "gemma4", "chatml"])
    parser.add_argument("--turns", type=int, default=150)
    parser.add_argument("--tokens", type=int, default=126_000, help="prompt tokens the session reaches at its end")
    parser.add_argument("--check-every", type=int, default=10, help="--render-check-every for both servers")
    parser.add_argument("--before", metavar="PYTHON", help="a third server, run by this interpreter")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if args.turns < 40:
        parser.error("--turns: at least 40 (early turns are 11 to 30, late the last 20)")
    logs = Path(tempfile.mkdtemp(prefix="looptrace-render-windows-"))
    result = {"turns": args.turns, "servers": {}}
    for family in args.families:
        result["servers"].update(run_family(family, args, logs))
    print(f"\n{args.turns} turns; early: turns 11-30, late: the last 20")
    print("| server | last prompt tokens | early p50 | late p50 | late / early | window / whole / fallback | drift |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, s in result["servers"].items():
        print(f"| {name} | {s['last_prompt_tokens']:,} | {s['early_p50_ms']} ms | {s['late_p50_ms']} ms | "
              f"{s['late_over_early']}× | {s['window']} / {s['whole']} / {s['fallback']} | {s['drift']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
    main()
