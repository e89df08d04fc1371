"""`--speculative-config`, shaped as vLLM's flag: read and checked here, without torch, so that the
command line can refuse a bad one at once and a process that does not decode never imports torch.
How each method drafts is speculative.py's."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

METHODS = ("ngram", "draft_model", "mtp")
KEYS = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model"}


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 0
    prompt_lookup_max: int = 0
    model: str | None = None

    def described(self) -> dict:
        """As /health shows it: the settings that are set."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v}

    @classmethod
    def parse(cls, text: str) -> SpeculativeConfig:
        """From --speculative-config's JSON, with vLLM's defaults (prompt lookup of 5 tokens when
        neither bound is given); a ValueError says what is wrong."""
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
        k = raw.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 32:
            raise ValueError("--speculative-config: num_speculative_tokens must be an integer from 1 to 32")
        low, high = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
        if method == "ngram":
            low, high = (5, 5) if low is None and high is None else (low or high, high or low)
            if not all(isinstance(v, int) and v >= 1 for v in (low, high)) or low > high:
                raise ValueError("--speculative-config: prompt_lookup_min and prompt_lookup_max must be integers "
                                 "with 1 <= min <= max")
        if method == "draft_model" and not isinstance(raw.get("model"), str):
            raise ValueError("--speculative-config: method draft_model needs a model (a checkpoint with the same "
                             "tokenizer)")
        if method == "mtp":
            # transformers (5.24) loads Qwen3.5 checkpoints without their multi-token-prediction layers:
            # it drops the `mtp.*` weights on load (_keys_to_ignore_on_load_unexpected).
            raise ValueError("--speculative-config: method mtp is not available: transformers loads Qwen3.5 without "
                             "its MTP head (it drops the mtp.* weights); use ngram or draft_model")
        return cls(method, k, low or 0, high or 0, raw.get("model"))
