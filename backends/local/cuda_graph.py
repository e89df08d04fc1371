"""The decode step captured in a CUDA graph: one launch per token instead of hundreds.

At batch size 1 a small model's decode step is bound by kernel launches, not by the GPU (Qwen3.5-0.8B
on an H200: 31 tok/s as a plain loop, against a memory-bandwidth bound near 1,400). Capturing the
step removes the launches. A capture needs every tensor the step touches at a fixed address, so
the graph comes with its own static cache: preallocated keys and values for the attention layers,
the fixed-size conv and recurrent state for the linear-attention (Gated DeltaNet) layers, and a
position counter kept on the device; both are updated in place, by transformers' StaticCache.

Graphs are made per cache length (powers of two), lazily, and kept; a request uses the smallest
that holds its prompt and its answer. Only cache layers whose state lives wholly in device
tensors can replay correctly (a sliding-window layer keeps a Python int), so other models decode
eagerly, as on the CPU.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("looptrace")

MIN_LENGTH = 1024


def graphable(model) -> bool:
    """Whether every layer of this model's static cache keeps its state in device tensors."""
    from transformers import StaticCache
    from transformers.cache_utils import LinearAttentionLayer, StaticLayer

    try:
        cache = StaticCache(config=model.config, max_cache_len=8)
    except Exception:  # noqa: BLE001 - a model transformers can't give a static cache
        return False
    return all(type(layer) in (StaticLayer, LinearAttentionLayer) for layer in cache.layers)


class GraphedDecoder:
    """A static cache of `length` tokens and the decode step captured over it."""

    def __init__(self, model, length: int) -> None:
        from transformers import StaticCache

        self.model = model
        self.length = length
        device = next(model.parameters()).device
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        self.token = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.logits: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self._capture()

    def _step(self) -> torch.Tensor:
        return self.model(input_ids=self.token, cache=self.cache, use_cache=True).logits[0, -1].float()

    def _capture(self) -> None:
        # The cache's tensors are allocated on first use: a short prefill makes them, then a few eager
        # steps on a side stream settle the allocator before the capture, as CUDA graphs require.
        self.prefill(torch.zeros((1, 4), dtype=torch.long, device=self.token.device))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._step()
        self._check()
        self.cache.reset()

    def _check(self, steps: int = 4) -> None:
        """Replays must give what plain calls give over the same cache, or the graph is not used.

        A value the step read on the host while capturing (a position, say) would be frozen into the
        graph and make every later token wrong without an error: this is where that shows.
        """
        dummy = torch.arange(4, dtype=torch.long, device=self.token.device).view(1, 4)
        runs = []
        for replay in (False, True):
            self.prefill(dummy)
            logits = []
            for i in range(steps):
                if replay:
                    logits.append(self.decode_one_token(i + 4).clone())
                else:
                    self.token.fill_(i + 4)
                    logits.append(self._step())
            runs.append(torch.stack(logits))
        if not torch.allclose(runs[0], runs[1], rtol=1e-3, atol=1e-3):
            raise RuntimeError(f"the captured decode step disagrees with plain calls "
                               f"(max difference {(runs[0] - runs[1]).abs().max().item():.3g})")

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """Eager: prompts vary in length. It fills the same static tensors the graph reads."""
        self.cache.reset()
        out = self.model(input_ids=prompt, cache=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float()

    def decode_one_token(self, token: int) -> torch.Tensor:
        self.token.fill_(token)  # a kernel with the id as its argument: no host-to-device copy, no sync
        self.graph.replay()
        return self.logits


class GraphedDecoders:
    """The graphs made so far, by cache length."""

    def __init__(self, model, max_length: int) -> None:
        self.model = model
        self.max_length = max_length
        self._by_length: dict[int, GraphedDecoder] = {}

    def for_length(self, needed: int) -> GraphedDecoder | None:
        if needed > self.max_length:
            return None
        length = MIN_LENGTH
        while length < needed:
            length *= 2
        length = min(length, self.max_length)
        decoder = self._by_length.get(length)
        if decoder is None:
            log.info("capturing the decode step for %d tokens of cache", length)
            try:
                decoder = self._by_length[length] = GraphedDecoder(self.model, length)
            except Exception:  # noqa: BLE001 - slower is better than wrong or down
                log.exception("no CUDA graph for this model: decoding with plain calls from now on")
                self.max_length = 0
                return None
        return decoder
