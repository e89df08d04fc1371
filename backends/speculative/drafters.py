"""The checkpoints' own drafters (`method: "mtp"`), chosen from a table by the model type that carries
one, the way backends/registry.py chooses a backend: adding one is its row and its module.

- Qwen3.5 (and its MoE): the MTP layer in the model's own checkpoint (mtp_qwen3_5.py);
- Gemma 4: the assistant checkpoint named as `model` (mtp_gemma4.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from looptrace.common.checkpoint import Checkpoint, fetch, read_config

from .config import SpeculativeConfig


@dataclass(frozen=True, slots=True)
class Drafter:
    model_types: tuple[str, ...]  # config.json's model_type of the checkpoints that carry it
    loader: str  # "module:function" (imported when chosen): function(drafter's folder, the loaded model)
    own_checkpoint: bool  # in the model's checkpoint (no `model`), or a checkpoint `model` names
    refusal: str  # what --speculative-config gets when `model` is given where it must not be, or missing


DRAFTERS = (
    Drafter(("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
            "looptrace.backends.speculative.mtp_qwen3_5:load_qwen3_5_mtp", True,
            "Qwen3.5's MTP layer is in its own checkpoint; leave out model"),
    Drafter(("gemma4", "gemma4_text"), "looptrace.backends.speculative.mtp_gemma4:load_gemma4_assistant", False,
            "method mtp on Gemma 4 drafts with its assistant checkpoint: give it as model "
            "(google/gemma-4-E2B-it-assistant for gemma-4-E2B-it)"),
)


def mtp_loader(checkpoint: Checkpoint, speculative: SpeculativeConfig) -> Callable:
    """A function of the loaded model that loads the checkpoint's own drafter; a ValueError says why
    there is none (checked before any weights are loaded)."""
    kind = checkpoint.config.get("model_type", "")
    drafter = next((d for d in DRAFTERS if kind in d.model_types), None)
    if drafter is None:
        raise ValueError(f"--speculative-config: method mtp drafts with Qwen3.5's MTP layer or a Gemma 4 assistant; "
                         f"this model ({kind or 'unknown'}) has neither: use suffix, ngram or draft_model")
    if bool(speculative.model) == drafter.own_checkpoint:
        raise ValueError(f"--speculative-config: {drafter.refusal}")
    # The assistant's vocabulary is checked against the model's when it loads.
    source = checkpoint if drafter.own_checkpoint else read_config(speculative.model, None)
    module, _, function = drafter.loader.partition(":")
    load = getattr(importlib.import_module(module), function)
    return lambda model: load(fetch(source), model)
