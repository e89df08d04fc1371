"""What an MTP drafter reads of the model's forward passes, taken as they happen (forward hooks), so
that prefill, the plain step and the verification pass run exactly as they do without it.

  HiddenTap    the model's last hidden state, its final norm's output (what the LM head reads, and
               what `hidden_states[-1]` is in transformers): Qwen3.5's MTP layer and Gemma 4's
               assistant are both fed it
  SharedKVTap  the keys and values of Gemma 4's last full-attention and last sliding-window layer
               that keep their own (the layers transformers marks "store"), which the assistant's
               layers attend to instead of keys and values of their own
"""

from __future__ import annotations

import torch


class HiddenTap:
    """Every forward pass's last hidden state, (positions, hidden) each, in order, until taken.
    `paused` while a pass runs again what the drafter already has (Drafting's re-run after a
    linear-attention state was put back)."""

    def __init__(self, model) -> None:
        self.chunks: list[torch.Tensor] = []
        self.paused = False
        self._handle = model.get_decoder().norm.register_forward_hook(self._hook)

    def _hook(self, _module, _args, output) -> None:
        if not self.paused:
            self.chunks.append(output[0])

    def take(self) -> list[torch.Tensor]:
        chunks, self.chunks = self.chunks, []
        return chunks

    def close(self) -> None:
        self._handle.remove()


class SharedKVTap:
    """The last pass's keys and values of the layers that keep them for the KV-shared layers, by
    layer type ({"full_attention": (keys, values), "sliding_attention": ...}, each (1, heads,
    positions, head_dim)): every position the cache holds for a full-attention layer, the window
    (and the pass) for a sliding one."""

    def __init__(self, model) -> None:
        self.states: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        decoder = model.get_decoder()
        self._handles = []
        for layer in decoder.layers:
            attention = layer.self_attn
            if getattr(attention, "store_full_length_kv", False):
                self._handles.append(attention.register_forward_hook(self._hook, with_kwargs=True))
        if not self._handles:
            raise ValueError("this model keeps no keys and values for an assistant to read (no KV-sharing layers)")

    def _hook(self, module, _args, kwargs, _output) -> None:
        shared = kwargs.get("shared_kv_states")
        if shared is not None and module.layer_type in shared:
            self.states[module.layer_type] = shared[module.layer_type]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
