"""Qwen3.5's own drafter: the multi-token-prediction (MTP) layer its checkpoints carry (`mtp.*`, about
20 M parameters in the 0.8B; `mtp_num_hidden_layers: 1` in the config), which transformers skips
when it loads the model. Its weights are read here from the checkpoint's safetensors.

The layer, as vLLM's Qwen3.5 MTP model runs it (vllm/model_executor/models/qwen3_5_mtp.py; the same
as Qwen3-Next's): for position i it takes the model's last hidden state h_i (after the final norm,
what the LM head reads) and the embedding of the token that followed, x_{i+1}; each is RMS-normed
(`pre_fc_norm_hidden`, `pre_fc_norm_embedding`, zero-centred weights as all of Qwen3.5's norms),
[embedding, hidden] concatenated and projected back to the hidden size (`fc`, no bias), then one
full-attention decoder layer of the model's own kind (gated queries, q/k norms, partial multimodal
rotary positions at position i; a KV cache of its own) and a final norm (`norm`). The model's own LM
head turns that into the guess for x_{i+2}. To guess further, the layer runs again on its own
output, fed the token it just guessed, one position on.

Drafting (MTPDrafter): every position the model computes is fed to the layer (its hidden state comes
from taps.HiddenTap, the next token from the output), in one batch when a draft is asked for, so
the layer's cache covers the context as the model's does; its guesses past the verified positions
are cut from that cache after each verification. Positions the prefix cache served are not
recomputed, so the layer does not see them (its drafts get worse there, never wrong: the model
verifies every one).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from ..sampling import draft_choice
from .taps import HiddenTap

PREFIX = "mtp."


def mtp_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's `mtp.*` tensors, read from its safetensors (one file or an index of shards)."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({name for key, name in weight_map.items() if key.startswith(PREFIX)})
    else:
        files = [path.name for path in sorted(folder.glob("*.safetensors"))]
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(folder / name), framework="pt") as handle:
            for key in handle.keys():
                if key.startswith(PREFIX):
                    tensors[key.removeprefix(PREFIX)] = handle.get_tensor(key)
    return tensors


class Qwen35MTP(nn.Module):
    """The MTP layer, its parameters named as the checkpoint's `mtp.*` tensors less the prefix."""

    def __init__(self, text_config) -> None:
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        super().__init__()
        config = copy.deepcopy(text_config)
        config.num_hidden_layers = 1
        config.layer_types = ["full_attention"]  # its cache is one attention layer
        self.config = config
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(config, 0)])
        self.norm = Qwen3_5RMSNorm(hidden, eps=eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache, rotary) -> torch.Tensor:
        """Its output (normed) at each of the positions: `embeds` of the tokens that followed them,
        `hidden` the model's (or, guessing further, its own) state there, each (1, n, hidden)."""
        from transformers.masking_utils import create_causal_mask

        x = self.fc(torch.cat((self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)), dim=-1))
        text_positions = positions.view(1, -1)
        rotated = rotary(x, text_positions[None].expand(3, 1, -1))  # text: the same position on each axis
        mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=None, cache=cache,
                                  position_ids=text_positions)
        x = self.layers[0](x, position_embeddings=rotated, attention_mask=mask, position_ids=text_positions,
                           cache=cache, use_cache=True)
        return self.norm(x)


def load_qwen3_5_mtp(folder: Path, model) -> Qwen3_5Drafting:
    """The checkpoint's MTP layer, beside the loaded `model` (whose dtype and device it takes); a
    ValueError says why there is none to draft with."""
    config = json.loads((folder / "config.json").read_text())
    layers = (config.get("text_config") or config).get("mtp_num_hidden_layers")
    tensors = mtp_tensors(folder)
    if not tensors:
        raise ValueError(f"--speculative-config: method mtp needs the checkpoint's MTP layer, and {folder} has no "
                         f"mtp.* weights (mtp_num_hidden_layers: {layers})")
    if layers not in (None, 1):
        raise ValueError(f"--speculative-config: this checkpoint has {layers} MTP layers; drafting here runs "
                         "Qwen3.5's one")
    parameter = next(model.parameters())
    mtp = Qwen35MTP(model.config.get_text_config())
    missing, unexpected = mtp.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"--speculative-config: the checkpoint's MTP weights do not fit Qwen3.5's MTP layer "
                         f"(missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]})")
    return Qwen3_5Drafting(mtp.to(device=parameter.device, dtype=parameter.dtype).eval())


class Qwen3_5Drafting:
    """The loaded MTP layer, as the local backend holds it: a drafter for each request."""

    tokens = 1  # drafts a pass when --speculative-config gives no num_speculative_tokens: one per MTP layer

    def __init__(self, mtp: Qwen35MTP) -> None:
        self.mtp = mtp

    def drafter(self, model, prompt_ids: list[int], sampling, generator) -> MTPDrafter:
        return MTPDrafter(self.mtp, model, prompt_ids, sampling, generator)


class MTPDrafter:
    """One request's drafts from the MTP layer (see the module's docstring). Made before the prompt
    is prefilled, so that its tap sees the prefill."""

    def __init__(self, mtp: Qwen35MTP, model, prompt_ids: list[int], sampling, generator) -> None:
        from transformers import DynamicCache

        self.mtp, self.sampling, self.generator = mtp, sampling, generator
        self.embed, self.head = model.get_input_embeddings(), model.get_output_embeddings()
        self.rotary = model.get_decoder().rotary_emb
        self.device = next(mtp.parameters()).device
        self.tap = HiddenTap(model)
        self.ids: list[int] = list(prompt_ids)
        self.fed = 0  # positions before this one are in the layer's cache (or were never computed here)
        self.cache = DynamicCache(config=mtp.config)
        self.pending: list[torch.Tensor] = []  # the model's hidden states from position `fed` on
        self.guessed = 0  # the layer's own guesses in its cache, past the verified positions
        self.probs: list[torch.Tensor] | None = None

    def prefilled(self, cached: int) -> None:
        """The prompt is in: the model computed it from position `cached` on (the prefix cache held the rest)."""
        self.fed = cached

    def append(self, token: int) -> None:
        self.ids.append(token)

    def propose(self, count: int) -> list[int]:
        self.pending.extend(self.tap.take())
        ready = sum(chunk.shape[0] for chunk in self.pending)
        if not ready or count < 1:
            return []
        start = self.fed
        # Position i is fed with the token that followed it: every computed position's is known.
        hidden = torch.cat(self.pending)[None]
        out = self._run(self.ids[start + 1:start + 1 + ready], hidden, start)
        self.fed, self.pending = start + ready, []
        drafts, probs = [], []
        state = out[:, -1:]
        for i in range(count):
            logits = self.head(state)[0, -1].float()
            token = self._choose(logits, probs)
            drafts.append(token)
            if i < count - 1:  # the next guess: its own state, fed the token it guessed, one position on
                state = self._run([token], state, self.fed + i)
                self.guessed += 1
        self.probs = probs or None
        return drafts

    def _run(self, tokens: list[int], hidden: torch.Tensor, first: int) -> torch.Tensor:
        ids = torch.tensor([tokens], device=self.device)
        positions = torch.arange(first, first + len(tokens), device=self.device)
        return self.mtp(self.embed(ids), hidden, positions, self.cache, self.rotary)

    def _choose(self, logits: torch.Tensor, probs: list) -> int:  # one draft (the tests record each first)
        return draft_choice(logits, self.sampling, self.generator, probs)

    def verified(self, accepted: int) -> None:
        """After the model's pass over `last` and the drafts: the layer's guesses leave its cache, and
        of the pass's hidden states those of `last` and the drafts that stood are kept."""
        if self.guessed:
            self.cache.crop(-self.guessed)
            self.guessed = 0
        chunks = self.tap.take()
        if chunks:
            chunks[-1] = chunks[-1][:accepted + 1]  # the pass's: positions after a rejected draft are wrong
        self.pending.extend(chunks)

    def finish(self) -> None:
        self.tap.close()
