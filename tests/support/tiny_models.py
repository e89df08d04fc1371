"""Seeded random-weight models of the real architectures, checked to give varied greedy output.

Each family's module (tiny_qwen3_5.py, tiny_gemma4.py) builds a tokenizer and a config; `build_model`
draws the weights: the same classes and chat template as the real checkpoints, at toy width.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from build_cache import BUILD_INFO

CHAT_SYSTEM = "You are a helpful assistant."


CHAT_USER = "What is the capital of France?"


def chat_messages() -> list[dict[str, str]]:
    """The system + user conversation of the *-plain.txt / *-thinking.txt examples."""
    return [{"role": "system", "content": CHAT_SYSTEM}, {"role": "user", "content": CHAT_USER}]


# Random weights at the usual std 0.02 make a tiny Qwen3.5 repeat one token forever, which makes
# generate()-equality tests vacuous. A wider init gives varied greedy output with clear margins;
# Gemma 4 (embedding scale, q/k norms, logit soft-capping) is varied at 0.05-0.1 and turns
# repetitive above ~0.15, so each family has its own default.
QWEN3_5_INIT_STD = 0.5


GEMMA4_INIT_STD = 0.1


DEFAULT_SEED = 1234


GREEDY_PROBE = 40  # tokens generated after the plain chat prompt when a build is checked


MIN_DISTINCT = 10  # of those, at least this many different ids


# Smallest accepted top-1 minus top-2 logit along that greedy path: far above float32 noise
# (~1e-5), so a manual decode loop and generate() can't pick different tokens by rounding.
MIN_MARGIN = 1e-3


def _reinit(model: Any, std: float, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            # Matrices, embeddings and convolutions; norms, biases and the gated-delta decay keep their init.
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float32) * std)


def chat_prompt_ids(tokenizer: Any, **template_kwargs: Any) -> list[int]:
    """Token ids of the plain chat prompt (thinking off) rendered with the checkpoint's own template."""
    kwargs = {"add_generation_prompt": True, "enable_thinking": False, **template_kwargs}
    prompt = tokenizer.apply_chat_template(chat_messages(), tokenize=False, **kwargs)
    # The rendered prompt already holds any bos: don't let the tokenizer add a second one.
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def greedy_probe(model: Any, prompt_ids: list[int], n: int, stop_ids: list[int]) -> tuple[list[int], float]:
    """Greedy continuation of `prompt_ids` (stopping on `stop_ids`) and its smallest top-2 logit margin."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=stop_ids,
            pad_token_id=stop_ids[0],
            output_scores=True,
            return_dict_in_generate=True,
        )
    generated = out.sequences[0, len(prompt_ids) :].tolist()
    margins = [float(top[0] - top[1]) for top in (s[0].topk(2).values for s in out.scores)]
    return generated, min(margins)


def build_model(
    out: Path,
    config_dict: dict[str, Any],
    config_cls: Any,
    model_cls: Any,
    *,
    seed: int,
    init_std: float,
    stop_ids: list[int],
) -> dict[str, Any]:
    """Save a seeded random model into `out` (which already holds the tokenizer).

    Seeds are tried from `seed` on until greedy output after the chat prompt runs the full probe
    length without a stop token, varies, and keeps clear logit margins.
    """
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = chat_prompt_ids(tokenizer)
    tried = []
    for attempt in range(16):
        use = seed + attempt
        torch.manual_seed(use)  # constructors draw some parameters themselves (A_log of the delta net)
        config = config_cls(**{k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")})
        config.get_text_config().initializer_range = init_std  # recorded; _reinit does the drawing
        model = model_cls(config).eval()
        _reinit(model, init_std, use)
        generated, margin = greedy_probe(model, prompt, GREEDY_PROBE, stop_ids)
        distinct = len(set(generated))
        tried.append({"seed": use, "generated": len(generated), "distinct": distinct, "min_margin": round(margin, 5)})
        if len(generated) == GREEDY_PROBE and distinct >= MIN_DISTINCT and margin >= MIN_MARGIN:
            break
    else:
        raise RuntimeError(f"no seed gave a varied greedy continuation: {tried}")
    model.save_pretrained(out, safe_serialization=True)
    return {"seed": use, "init_std": init_std, "greedy_probe": {**tried[-1], "tokens": generated}, "seeds_tried": tried}


def copy_tokenizer(tokenizer_dir: Path, out: Path) -> None:
    """A tokenizer folder's files into a model folder: copies, so editing one never changes the other."""
    for item in tokenizer_dir.iterdir():
        if item.name != BUILD_INFO:
            shutil.copy2(item, out / item.name)
