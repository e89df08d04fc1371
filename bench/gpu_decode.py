"""Decode speed on a GPU: `generate()`, the local backend plain, the backend replaying a CUDA graph, and
the backend with speculative decoding (prompt lookup, suffix decoding, the MTP layer).

    python bench/gpu_decode.py --tokenizer DIR [--prompt 512] [--tokens 256] [--out result.json]

Random weights of the Qwen3.5-0.8B architecture (24 layers: 18 Gated DeltaNet + 6 full attention,
hidden 1024, 8 heads, 2 KV heads, head_dim 256, vocabulary 248,320) in bfloat16, a random 512-token
prompt, 256 new tokens, greedy. Also measures the device's copy bandwidth, and from it the bound a
decode step cannot beat: it must read every weight once per token. Speculation: what a verification
pass of 1–9 tokens costs against a one-token step (what bounds its speed-up), and prompt lookup on a
prompt that holds the model's own earlier answer (the prompt, that answer, the prompt again), its
tokens compared with plain decoding's (bfloat16 passes of several tokens may round differently from
single steps); suffix decoding on the same prompt; and Qwen3.5's MTP layer (random weights of its
real shape: one full-attention layer with the model's head, so its drafts are rejected: what is
measured is what a drafter step costs against a model step, and that the output is unchanged).
Prints one JSON object.
Written to run in a couple of minutes on a lent H200 with nothing installed but a carried wheel.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import traceback
from pathlib import Path

import torch

from _gpu_model import DEVICE, DTYPE, build_model, device_name, sync


def copy_bandwidth(gigabytes: float = 4.0, repeats: int = 10) -> float:
    """Bytes read plus bytes written per second, for a device-to-device copy."""
    if DEVICE != "cuda":
        return 0.0
    source = torch.empty(int(gigabytes * 1e9) // 2, dtype=torch.bfloat16, device="cuda")
    target = torch.empty_like(source)
    target.copy_(source)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        target.copy_(source)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000
    moved = 2 * source.numel() * source.element_size() * repeats
    del source, target
    torch.cuda.empty_cache()
    return moved / seconds


def time_generate(model, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    ids = torch.tensor([prompt], device=DEVICE)
    sync()
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    sync()
    return time.perf_counter() - started, out[0, len(prompt):].tolist()


def time_backend(backend, prompt: list[int], tokens: int) -> tuple[float, float, list[int]]:
    """(whole request seconds, decode tokens/s after the first token, ids)."""
    from looptrace.backends.base import DecodeRequest, SamplingParams

    async def run():
        request = DecodeRequest(prompt, tokens, SamplingParams(temperature=0), frozenset())
        started = time.perf_counter()
        events = [e async for e in backend.generate(request)]
        seconds = time.perf_counter() - started
        done = events[-1]
        return seconds, done["tokens_per_second"], [e["id"] for e in events if e["type"] == "token"]

    return asyncio.run(run())


def mtp_costs(model, drafting, prompt: list[int], repeats: int = 5) -> dict[int, float]:
    """What a proposal of 1 and of 3 drafts costs against a model step, each the median of `repeats`. As
    the backend runs the drafter: made before the prompt's pass (its tap takes that pass's hidden states),
    then each proposal after a model step that gave it one more hidden state and one more token."""
    from looptrace.backends.base import SamplingParams

    drafter = drafting.drafter(model, prompt, SamplingParams(temperature=0), None)
    proposals: dict[int, list[float]] = {1: [], 3: []}
    steps: list[float] = []
    try:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([prompt], device=DEVICE), use_cache=True)
            cache, token = out.cache, int(out.logits[0, -1].argmax())
            drafter.prefilled(0)
            drafter.append(token)
            drafter.propose(1)  # the prompt's hidden states go in, untimed
            drafter.verified(0)
            for count in (1, 3) * repeats:
                sync()
                started = time.perf_counter()
                logits = model(input_ids=torch.tensor([[token]], device=DEVICE), cache=cache, use_cache=True).logits
                sync()
                steps.append(time.perf_counter() - started)
                token = int(logits[0, -1].argmax())
                drafter.append(token)
                started = time.perf_counter()
                drafter.propose(count)
                sync()
                proposals[count].append(time.perf_counter() - started)
                drafter.verified(0)  # none stood: its guesses leave its cache
    finally:
        drafter.finish()
    step = sorted(steps)[len(steps) // 2]
    return {count: round(sorted(times)[len(times) // 2] / step, 3) for count, times in proposals.items()}


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="a Qwen3.5 tokenizer folder (the vocabulary only matters)")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--out")
    args = parser.parse_args()

    import transformers
    from transformers import AutoTokenizer

    from looptrace.backends.local.backend import LocalBackend
    from looptrace.backends.speculative.config import SpeculativeConfig
    from looptrace.common.vocabulary import Vocabulary

    result: dict = {"torch": torch.__version__, "transformers": transformers.__version__,
                    "device": device_name(),
                    "prompt_tokens": args.prompt, "new_tokens": args.tokens}
    vocab = Vocabulary(AutoTokenizer.from_pretrained(args.tokenizer))
    model = build_model()
    prompt = torch.randint(1000, 200000, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    ids: dict[str, list[int]] = {}

    def bandwidth() -> None:
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        moved = copy_bandwidth()
        result.update(weight_bytes=weight_bytes, copy_bandwidth_bytes_per_s=moved,
                      bandwidth_bound_tok_s=round(moved / weight_bytes, 1))

    def generate() -> None:
        time_generate(model, prompt[:16], 4)  # warm-up: kernels load, allocator settles
        seconds, ids["generate"] = time_generate(model, prompt, args.tokens)
        result["generate_tok_s"] = round(args.tokens / seconds, 2)

    def eager() -> None:
        backend = LocalBackend(model, vocab)
        time_backend(backend, prompt[:16], 4)
        seconds, rate, ids["eager"] = time_backend(backend, prompt, args.tokens)
        result.update(eager_backend_tok_s=round(args.tokens / seconds, 2), eager_backend_decode_tok_s=round(rate, 2),
                      eager_equals_generate_until=first_difference(ids["eager"], ids.get("generate", [])))
        asyncio.run(backend.close())

    def graphed() -> None:
        started = time.perf_counter()
        backend = LocalBackend(model, vocab, graph_max_length=4096)
        assert backend.graphs is not None, "the model's static cache cannot be captured"
        time_backend(backend, prompt[:16], 4)  # captures the graph of the 1024-token bucket, which all runs use
        result["graph_capture_seconds"] = round(time.perf_counter() - started, 2)
        seconds, rate, ids["graph"] = time_backend(backend, prompt, args.tokens)
        seconds2, rate2, again = time_backend(backend, prompt, args.tokens)  # the same graph, reused
        result.update(
            graph_backend_tok_s=round(args.tokens / min(seconds, seconds2), 2),
            graph_backend_decode_tok_s=round(max(rate, rate2), 2),
            graph_runs_identical=ids["graph"] == again,
            graph_equals_eager_until=first_difference(ids["graph"], ids.get("eager", [])),
            graph_equals_generate_until=first_difference(ids["graph"], ids.get("generate", [])),
        )
        # The same static cache stepped without the graph: replaying must not change a single token.
        decoder = backend.graphs.for_length(args.prompt + args.tokens)
        with torch.inference_mode():
            logits = decoder.prefill(torch.tensor([prompt], device=DEVICE))
            static = [int(logits.argmax())]
            for _ in range(args.tokens - 1):
                decoder.token.copy_(torch.tensor([[static[-1]]], device=DEVICE))
                static.append(int(decoder._step().argmax()))
        result["graph_equals_static_eager_until"] = first_difference(ids["graph"], static)
        result["graph_greedy_unchanged"] = ids["graph"] == static
        asyncio.run(backend.close())

    def speculative() -> None:
        from looptrace.backends.speculative.drafting import Rollback

        # What a pass of n tokens costs, after the prompt, against one token (each pass undone after).
        costs = {}
        with torch.inference_mode():
            cache = model(input_ids=torch.tensor([prompt], device=DEVICE), use_cache=True).cache
            rollback = Rollback(cache)
            for n in range(1, 10):
                times = []
                for _ in range(5):
                    rollback.before()
                    sync()
                    started = time.perf_counter()
                    model(input_ids=torch.tensor([prompt[:n]], device=DEVICE), cache=cache, use_cache=True)
                    sync()
                    times.append(time.perf_counter() - started)
                    rollback.after(n, 0)
                costs[n] = sorted(times)[2]
        result["verify_pass_cost_vs_one_token"] = {n: round(t / costs[1], 2) for n, t in costs.items()}
        copying = prompt + ids.get("eager", []) + prompt
        config = '{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
        backend = LocalBackend(model, vocab)
        time_backend(backend, prompt[:16], 4)
        _, plain_rate, plain = time_backend(backend, copying, args.tokens)
        ids["speculative_plain"] = plain
        backend.speculative = SpeculativeConfig.parse(config)
        started = time.perf_counter()
        _, rate, drafted = time_backend(backend, copying, args.tokens)
        result.update(speculative_config=json.loads(config), speculative_prompt_tokens=len(copying),
                      speculative_plain_decode_tok_s=round(plain_rate, 2), speculative_decode_tok_s=round(rate, 2),
                      speculative_seconds=round(time.perf_counter() - started, 2),
                      speculative_equals_plain_until=first_difference(drafted, plain),
                      speculative_greedy_unchanged=drafted == plain)
        asyncio.run(backend.close())

    def suffix() -> None:
        copying = prompt + ids.get("eager", []) + prompt
        config = '{"method": "suffix", "num_speculative_tokens": 16}'
        backend = LocalBackend(model, vocab, speculative=SpeculativeConfig.parse(config))
        time_backend(backend, prompt[:16], 4)
        _, rate, drafted = time_backend(backend, copying, args.tokens)
        result.update(suffix_config=json.loads(config), suffix_decode_tok_s=round(rate, 2),
                      suffix_equals_plain_until=first_difference(drafted, ids.get("speculative_plain", [])))
        asyncio.run(backend.close())

    def mtp() -> None:
        from looptrace.backends.speculative.mtp_qwen3_5 import Qwen3_5Drafting, Qwen35MTP

        torch.manual_seed(2)
        layer = Qwen35MTP(model.config).to(device=DEVICE, dtype=DTYPE).eval()
        drafting = Qwen3_5Drafting(layer)
        costs = mtp_costs(model, drafting, prompt)
        result["mtp_draft_cost_vs_model_step"] = costs
        backend = LocalBackend(model, vocab, speculative=SpeculativeConfig.parse('{"method": "mtp"}'), mtp=drafting)
        _, rate, drafted = time_backend(backend, prompt, args.tokens)
        result.update(mtp_decode_tok_s=round(rate, 2),
                      mtp_equals_eager_until=first_difference(drafted, ids.get("eager", [])))
        asyncio.run(backend.close())

    steps = [bandwidth, generate, eager] + ([graphed] if DEVICE == "cuda" else []) + [speculative, suffix, mtp]
    for step in steps:  # each reports its own failure; the others' figures still count
        try:
            step()
        except Exception as exc:  # noqa: BLE001
            result[f"{step.__name__}_error"] = f"{type(exc).__name__}: {exc}"
            result[f"{step.__name__}_traceback"] = traceback.format_exc()[-3000:]

    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
