"""`--speculative-config`, shaped as vLLM's flag: read and checked here, without torch, so that the
command line can refuse a bad one at once and a process that does not decode never imports torch.
How each method drafts is speculative.py's (and suffix.py's, mtp_qwen3_5.py's, mtp_gemma4.py's)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

METHODS = ("ngram", "draft_model", "mtp", "suffix")
# vLLM's names for suffix decoding's settings, and its defaults for them.
SUFFIX_KEYS = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
               "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}
# looptrace's own key (llama.cpp): how many drafts a pass carries, "measured" (as many as pay on this
# machine, pass_cost.py) or "fixed" (all of them, as vLLM does: to compare, or to test drafting anywhere).
DRAFT_LENGTHS = ("measured", "fixed")
KEYS = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model", "draft_length",
        *SUFFIX_KEYS}
# Suffix decoding's bound in memory beside vLLM's count of requests: the tokens kept of earlier
# requests, the least recently used dropped first (about 200 bytes each with their index, measured on
# source code: about 100 MB, up to twice that before dropped sequences' entries are swept out).
SUFFIX_MAX_TOKENS = 1 << 19


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    # None (mtp only, when not given): the checkpoint's own count (Qwen3.5: its MTP layers; a Gemma 4
    # assistant: its generation config's num_assistant_tokens), resolved when the drafter loads.
    num_speculative_tokens: int | None
    prompt_lookup_min: int = 0
    prompt_lookup_max: int = 0
    model: str | None = None
    suffix_decoding_max_tree_depth: int = 0
    suffix_decoding_max_cached_requests: int = 0
    suffix_decoding_max_spec_factor: float = 0.0
    suffix_decoding_min_token_prob: float = 0.0
    draft_length: str = "measured"

    def described(self) -> dict:
        """As /health shows it: the settings that are set (the draft length only when fixed)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v and (k, v) != ("draft_length", "measured")}

    @classmethod
    def parse(cls, text: str) -> SpeculativeConfig:
        """From --speculative-config's JSON, with vLLM's defaults (prompt lookup of 5 tokens when
        neither bound is given; suffix decoding's tree depth, 24, as its draft length); a ValueError
        says what is wrong."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--speculative-config is not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError("--speculative-config must be a JSON object")  # noqa: TRY004 - argparse reports ValueErrors
        unknown = sorted(set(raw) - KEYS)
        if unknown:
            raise ValueError(f"--speculative-config: {', '.join(unknown)} not understood here (this server reads "
                             f"{', '.join(sorted(KEYS))})")
        method = raw.get("method") or ("draft_model" if raw.get("model") else None)
        if method not in METHODS:
            raise ValueError(f"--speculative-config: method must be one of {', '.join(METHODS)}, not {method!r}")
        suffix = _suffix_settings(raw, method)
        k = raw.get("num_speculative_tokens")
        if k is None and method in ("mtp", "suffix"):
            k = suffix.get("suffix_decoding_max_tree_depth")  # suffix: vLLM's default; mtp: the checkpoint's
        elif not _integer(k) or not 1 <= k <= 32:
            raise ValueError("--speculative-config: num_speculative_tokens must be an integer from 1 to 32")
        low, high = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
        if method == "ngram":
            low, high = (5, 5) if low is None and high is None else (low or high, high or low)
            if not all(_integer(v) and v >= 1 for v in (low, high)) or low > high:
                raise ValueError("--speculative-config: prompt_lookup_min and prompt_lookup_max must be integers "
                                 "with 1 <= min <= max")
        if method == "draft_model" and not isinstance(raw.get("model"), str):
            raise ValueError("--speculative-config: method draft_model needs a model (a checkpoint with the same "
                             "tokenizer)")
        if raw.get("model") is not None and not isinstance(raw["model"], str):
            raise ValueError("--speculative-config: model must be a path or a Hub id")
        length = raw.get("draft_length", "measured")
        if length not in DRAFT_LENGTHS:
            raise ValueError(f"--speculative-config: draft_length must be {' or '.join(DRAFT_LENGTHS)}, not {length!r}")
        return cls(method, k, low or 0, high or 0, raw.get("model"), **suffix, draft_length=length)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _suffix_settings(raw: dict, method: str) -> dict:
    """Suffix decoding's four settings, vLLM's defaults filled in; refused for another method."""
    given = [key for key in SUFFIX_KEYS if key in raw]
    if method != "suffix":
        if given:
            raise ValueError(f"--speculative-config: {', '.join(given)} is for method suffix")
        return {}
    settings = {key: raw.get(key, default) for key, default in SUFFIX_KEYS.items()}
    depth, cached = settings["suffix_decoding_max_tree_depth"], settings["suffix_decoding_max_cached_requests"]
    if not _integer(depth) or not 1 <= depth <= 64:
        raise ValueError("--speculative-config: suffix_decoding_max_tree_depth must be an integer from 1 to 64")
    if not _integer(cached) or cached < 0:
        raise ValueError("--speculative-config: suffix_decoding_max_cached_requests must be an integer >= 0 (0: "
                         "only the request's own prompt and output)")
    factor, low = settings["suffix_decoding_max_spec_factor"], settings["suffix_decoding_min_token_prob"]
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 64:
        raise ValueError("--speculative-config: suffix_decoding_max_spec_factor must be a number above 0")
    if not isinstance(low, (int, float)) or isinstance(low, bool) or not 0 <= low <= 1:
        raise ValueError("--speculative-config: suffix_decoding_min_token_prob must be a number from 0 to 1")
    settings["suffix_decoding_max_spec_factor"] = float(factor)
    settings["suffix_decoding_min_token_prob"] = float(low)
    return settings
