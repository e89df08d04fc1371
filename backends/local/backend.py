"""The local backend: a transformers model decoded on this machine, one request at a time.

Its promise: greedy decoding matches `model.generate()` token for token (same forward calls, same
argmax). The model runs in one worker thread (decode_thread.py), so the event loop never runs model
code; requests wait in a FIFO queue, and past its bound they are refused with a 429.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from functools import partial

import torch

from looptrace.common.vocabulary import Vocabulary

from ..base import DecodeRequest, TokenScore
from ..decode_thread import DecodeThread, Emit, OnDecodeThread
from ..events import Event, prefill_event
from ..sampling import Choice, Penalties, generator_for, next_token
from ..scoring import score_transformers
from ..speculative.config import SUFFIX_MAX_TOKENS, SpeculativeConfig
from ..speculative.drafting import Drafting
from ..speculative.suffix import SuffixCache
from ..token_loop import run_tokens
from .prefix_cache import MAX_BYTES, PrefixCache

log = logging.getLogger("looptrace")


def prefill(model, prompt: torch.Tensor, cache=None, media: dict | None = None):
    """Run the prompt (or, after `cache`, the rest of it) once; keep only the last position's logits.
    `media`: the processor's tensors for the prompt's images, read with it."""
    out = model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1, **(media or {}))
    return out.logits[0, -1].float(), out.cache


def on_device(media: dict, model) -> dict:
    """The processor's tensors where the model is; floating ones (pixels) in its dtype."""
    return {k: v.to(model.device, dtype=model.dtype if v.is_floating_point() else v.dtype) if torch.is_tensor(v) else v
            for k, v in media.items()}


def decode_one_token(model, token: int, cache) -> torch.Tensor:
    out = model(input_ids=torch.tensor([[token]], device=model.device), cache=cache, use_cache=True)
    return out.logits[0, -1].float()


def reset_model_state(model) -> None:
    # Qwen3.5 keeps the multimodal rope offset of the last prompt on the model; a stale one
    # shifts every position of the next request.
    inner = getattr(model, "model", None)
    if inner is not None and getattr(inner, "rope_deltas", None) is not None:
        inner.rope_deltas = None


def model_state(model) -> dict | None:
    """What the model keeps beside its cache after a prompt (the rope offset an image gave it), for
    the prefix cache to keep with that cache."""
    deltas = getattr(getattr(model, "model", None), "rope_deltas", None)
    return {"rope_deltas": deltas} if deltas is not None else None


def restore_model_state(model, state: dict | None) -> None:
    if state:
        model.model.rope_deltas = state["rope_deltas"]



class LocalBackend(OnDecodeThread):
    name = "local"
    media_refusal = ""

    def __init__(self, model, vocab: Vocabulary, *, max_queue: int = 64, graph_max_length: int = 0,
                 prefix_cache_tokens: int = 0, prefix_cache_bytes: int = MAX_BYTES,
                 speculative: SpeculativeConfig | None = None, drafter=None, mtp=None) -> None:
        """`model`: a loaded model, or a function that loads one, which then runs on the decode thread.
        `drafter` (draft_model) likewise; `mtp` (method mtp): the checkpoint's own drafter
        (mtp_qwen3_5.Qwen3_5Drafting, mtp_gemma4.AssistantDrafting), or a function of the loaded
        model that loads it.

        Every use of the model stays on that one thread. PyTorch's CPU thread pool (OpenMP) belongs to
        the thread that uses it: a model loaded on one thread and run on another makes two pools
        contend for the cores, which halved decode speed on these two-core machines.
        """
        self.vocab = vocab
        self.speculative = speculative  # speculative.py; None: plain decoding
        self.prefix_cache = PrefixCache(prefix_cache_tokens, prefix_cache_bytes) if prefix_cache_tokens > 0 else None
        self._thread = DecodeThread(self._run, max_queue=max_queue, name="local")
        self.model = model if isinstance(model, torch.nn.Module) else self.call(model)
        # speculative draft_model: the smaller model that drafts, loaded on the same thread
        self.drafter = drafter if drafter is None or isinstance(drafter, torch.nn.Module) else self.call(drafter)
        self.mtp = self.call(partial(mtp, self.model)) if callable(mtp) else mtp
        if self.mtp is not None and speculative.num_speculative_tokens is None:  # the checkpoint's own count
            self.speculative = dataclasses.replace(speculative, num_speculative_tokens=self.mtp.tokens)
        # suffix: earlier requests' prompts and answers, kept for later ones to draft from
        self.suffix = None
        if speculative is not None and speculative.method == "suffix":
            self.suffix = SuffixCache(speculative.suffix_decoding_max_cached_requests, SUFFIX_MAX_TOKENS,
                                      speculative.suffix_decoding_max_tree_depth,
                                      speculative.suffix_decoding_max_spec_factor,
                                      speculative.suffix_decoding_min_token_prob)
        self.device = next(self.model.parameters()).device
        # On a GPU the decode step replays a captured CUDA graph (cuda_graph.py); elsewhere, plain calls.
        self.graphs = None
        if graph_max_length and self.device.type == "cuda":
            from .cuda_graph import GraphedDecoders, graphable

            if graphable(self.model):
                self.graphs = GraphedDecoders(self.model, graph_max_length)
                if self.prefix_cache is not None:
                    # The graph's static cache is filled by a whole prefill; the prefix cache's kept states
                    # are dynamic caches. /health says so too (health_details).
                    log.info("decoding with a captured CUDA graph: prompts of text are prefilled whole, so the prefix "
                             "cache serves only prompts with media (--enforce-eager: the prefix cache for every prompt)")

    def call(self, function: Callable[[], object]) -> object:
        """Runs `function` on the decode thread, after the requests already queued, and returns its result."""
        return self._thread.call(function)

    def prefix_cache_stats(self) -> dict | None:
        kept = self.prefix_cache
        return None if kept is None else {"prompts": len(kept), "tokens": kept.tokens, "max_tokens": kept.max_tokens,
                                        "bytes": kept.bytes, "max_bytes": kept.max_bytes}

    def health_details(self) -> dict:
        details: dict = {}
        if self.prefix_cache is not None:
            details["prefix_cache"] = self.prefix_cache_stats()
        if self.speculative is not None:  # as configured: the counts are in the traces and metrics
            details["speculative"] = self.speculative.described()
            if self.suffix is not None:  # suffix decoding's sequences kept
                details["drafting"] = {"kept": self.suffix.stats()}
        if self.graphs is not None:
            # A captured graph prefills whole prompts: the prefix cache and speculation are not used on it.
            details["cuda_graph"] = {"max_length": self.graphs.max_length, "prefix_cache": False}
        return details

    async def close(self) -> None:
        await self._thread.close()  # a thread killed inside torch at exit aborts the process

    async def score(self, prompt_ids: list[int], answer_ids: list[int],
                    cache_salt: str | None = None) -> list[TokenScore]:
        """Teacher-forced scoring (scoring.py), in turn with the requests on the decode thread; from
        nothing, so whatever the salt, no kept state is read or kept."""
        return await self._thread.run(partial(score_transformers, self.model, prompt_ids, answer_ids,
                                              reset_model_state))

    def _run(self, request: DecodeRequest, emit: Emit) -> None:
        with torch.inference_mode():
            self._decode(request, emit)

    def _decode(self, request: DecodeRequest, emit: Emit) -> None:
        model, vocab, sampling = self.model, self.vocab, request.sampling
        generator = generator_for(sampling, self.device)
        reset_model_state(model)

        started = time.perf_counter()
        # A captured graph decodes one token a step: speculative decoding, when on, runs without it.
        graphed = self.graphs.for_length(len(request.prompt_ids) + request.max_tokens) \
            if self.graphs and request.media is None and self.speculative is None else None
        # Made before prefill: an MTP drafter reads the model's hidden states from it on.
        proposer = self._proposer(request, generator) if self.speculative is not None and graphed is None else None
        try:
            if graphed is not None:
                cached = written = 0
                logits = graphed.prefill(torch.tensor([request.prompt_ids], device=self.device))
                step = graphed.decode_one_token
            else:
                media = on_device(request.media, model) if request.media is not None else None
                cached, written, logits, cache = self._prefill(request.prompt_ids, request.keep_at, media,
                                                               request.media_key, request.cache_salt)
                step = partial(decode_one_token, model, cache=cache)
            if hasattr(proposer, "prefilled"):
                proposer.prefilled(cached)
            self._generate(request, emit, logits, step, cache if graphed is None else None, generator, proposer,
                           started, cached, written)
        finally:
            if proposer is not None and hasattr(proposer, "finish"):
                proposer.finish()

    def _proposer(self, request: DecodeRequest, generator):
        """What drafts for this request, where the method needs more than the prompt (None: prompt
        lookup, or the draft model, which Drafting makes itself)."""
        if self.suffix is not None:
            return self.suffix.begin(request.prompt_ids, request.conversation)
        if self.mtp is not None:
            return self.mtp.drafter(self.model, request.prompt_ids, request.sampling, generator)
        return None

    def _generate(self, request: DecodeRequest, emit: Emit, logits, step, cache, generator, proposer, started: float,
                  cached: int, written: int) -> None:
        """After prefill: the first token, then the decode loop (token_loop.run_tokens)."""
        sampling = request.sampling
        penalties = Penalties(sampling, logits) if sampling.penalised else None
        choice = next_token(logits, sampling, generator, penalties)
        if penalties is not None:  # the penalties count every token chosen, drafted ones as they are verified
            penalties.add(choice.token_id)
        emit(prefill_event(len(request.prompt_ids), cached, time.perf_counter() - started))
        drafting = Drafting(self.speculative, self.model, cache, request.prompt_ids, sampling, generator, penalties,
                            self.device, self.drafter, proposer) \
            if self.speculative is not None and cache is not None else None

        def choose_after(token_id: int) -> Choice:
            logits = step(token_id)
            if drafting is not None:
                drafting.trim()
            choice = next_token(logits, sampling, generator, penalties)
            if penalties is not None:
                penalties.add(choice.token_id)
            return choice

        run_tokens(request, self.vocab, emit, choice, choose_after, drafting=drafting, cached=cached, written=written)

    def _prefill(self, prompt_ids: list[int], keep_at: int | None, media: dict | None = None,
                 media_key: tuple = (), salt: str | None = None) -> tuple[int, int, torch.Tensor, object]:
        """Prefills what the prefix cache does not hold yet, keeping the state after `keep_at` ids.
        `media`: the processor's tensors, read with the chunk that holds every item's tokens;
        `media_key`: each item's (offset, length, sha256), part of what a kept prompt is; `salt`: the
        tenant's (prefix_cache.py).

        Returns the number of prompt tokens that came from the cache, the number whose state this
        request added to it, the logits and the cache.
        """
        model, kept_cache = self.model, self.prefix_cache
        end = max((offset + length for offset, length, _ in media_key), default=0)
        point = min(keep_at or len(prompt_ids), len(prompt_ids))
        if kept_cache is None or point < end:  # no cache, or an item the kept state would cut in two
            logits, cache = prefill(model, torch.tensor([prompt_ids], device=self.device), None, media)
            return 0, 0, logits, cache
        cached, kept = kept_cache.take(prompt_ids, media_key, salt)
        cache, logits = (kept.cache, kept.logits) if kept is not None else (None, None)
        if kept is not None:
            restore_model_state(model, kept.state)
            media = None  # every item is in the kept state (take's rule)
        # Up to the point worth keeping first, so its state is copied before the rest goes in (a kept
        # state past that point, just taken, is kept again as it is).
        point = max(cached, point)
        if cached < point:
            logits, cache = prefill(model, torch.tensor([prompt_ids[cached:point]], device=self.device), cache, media)
        written = point - cached if kept_cache.keep(prompt_ids[:point], cache, logits, media_key,
                                                    model_state(model), salt) else 0
        if point < len(prompt_ids):
            logits, cache = prefill(model, torch.tensor([prompt_ids[point:]], device=self.device), cache)
        return cached, written, logits, cache

