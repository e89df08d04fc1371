"""The llama.cpp backend: a GGUF model decoded in this process by llama.cpp (llama-cpp-python),
at llama.cpp's speed, with the same events and token-level traces as the local backend.

What it promises: the prompt's token ids go in as they are (llama.cpp tokenizes nothing), and the
choice of each token is looptrace's own (sampling.py: the local backend's rules, seeds included),
made from the logits llama.cpp returns, read in place; so greedy output equals llama-cpp-python's
own greedy completion of the same ids, and p, logprob, rank and the top five are the model's own, as
every backend reports them. What it does not: match transformers token for token (the weights stay
quantized here, and llama.cpp's kernels differ).

One context, one request at a time, on one decode thread (decode_thread.py); an agent's next turn
reuses the KV cache of the turn before (reuse.py); speculative decoding (prompt lookup or
suffix decoding) verifies a draft in one batch and cuts the cache back past the rejected tokens.
A batch's rows cost llama.cpp nearly a step each on a CPU, so the drafts a pass carries are as many
as their chances of standing pay for, by what passes and steps are measured to cost (pass_cost.py);
what a verified token is: the model's greedy choice (or draw) at that position from the logits
llama.cpp's batch kernels computed, which round differently from its one-token kernels, so a near-tie
may fall the other way than in plain decoding (README, "llama.cpp", says how often).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import torch

from looptrace.common.vocabulary import Vocabulary

from ..base import BackendError, DecodeRequest, Loader, TextModel, TokenScore
from ..decode_thread import DecodeThread, Emit, OnDecodeThread
from ..events import Event, done_event, prefill_event
from ..sampling import Choice, Penalties, generator_for, greedy_choice, next_token
from ..scoring import score_llama_cpp
from ..speculative.config import SUFFIX_MAX_TOKENS, SpeculativeConfig
from ..speculative.drafting import Backoff, PromptLookup, judge
from ..speculative.pass_cost import Acceptance, PassCost, chances_of
from ..speculative.suffix import SuffixCache
from ..token_loop import run_tokens
from .context import BATCH, LlamaContext, physical_cores
from .reuse import PrefixReuse

log = logging.getLogger("looptrace")

# llama.cpp allocates the KV cache for the whole context up front (transformers grows it as it
# goes): a GGUF's own context of 128K tokens would take 16 GiB for an 8B model before any request.
DEFAULT_CONTEXT = 32768
CPU = torch.device("cpu")


def default_context(gguf_context: int) -> int:
    """The context to allocate when --max-model-len is not given."""
    if gguf_context > DEFAULT_CONTEXT:
        log.info("context: %d tokens of the model's %d (llama.cpp allocates all of it up front); "
                 "--max-model-len sets it", DEFAULT_CONTEXT, gguf_context)
        return DEFAULT_CONTEXT
    return gguf_context


class LlamaCppBackend(OnDecodeThread):
    name = "llama.cpp"
    media_refusal = "The llama.cpp backend reads text only."

    def __init__(self, load: Callable[[], LlamaContext], vocab: Vocabulary, *, max_queue: int,
                 prefix_cache_tokens: int, prefix_cache_bytes: int,
                 speculative: SpeculativeConfig | None = None) -> None:
        """`load` makes the context, on the decode thread, the one thread that will ever use it."""
        self.vocab = vocab
        self.speculative = speculative
        self._thread = DecodeThread(self._decode, max_queue=max_queue, name="llama.cpp")
        try:
            self.context: LlamaContext = self._thread.call(partial(_prepared, load))
        except BaseException:
            self._thread.stop()
            raise
        try:
            same_vocabulary(self.context, vocab)
            if speculative is not None and not self.context.can_cut:
                raise ValueError("--speculative-config: this model's state is recurrent and cannot be cut back "
                                 "past a rejected draft, so it cannot speculate on llama.cpp")
        except ValueError:
            self._thread.call(self.context.close)
            self._thread.stop()
            raise
        self.reuse = PrefixReuse(self.context, prefix_cache_tokens, prefix_cache_bytes)
        # What a step and each extra row of a verification pass cost here: measured once now, then as
        # requests run.
        self.cost = PassCost()
        if speculative is not None:
            self.cost = self._thread.call(partial(measured_cost, self.context))
            self.cost.fixed = speculative.draft_length == "fixed"
        self.suffix = None  # suffix decoding: earlier requests' prompts and answers
        if speculative is not None and speculative.method == "suffix":
            self.suffix = SuffixCache(speculative.suffix_decoding_max_cached_requests, SUFFIX_MAX_TOKENS,
                                      speculative.suffix_decoding_max_tree_depth,
                                      speculative.suffix_decoding_max_spec_factor,
                                      speculative.suffix_decoding_min_token_prob)

    def prefix_cache_stats(self) -> dict:
        return self.reuse.stats()

    def health_details(self) -> dict:
        context = self.context
        details = {"llama_cpp": {"threads": context.threads, "n_gpu_layers": context.n_gpu_layers,
                                 "context": context.n_ctx, "model_context": context.n_ctx_train}}
        stats = self.reuse.stats()
        if stats is not None:
            details["prefix_cache"] = stats
        if self.speculative is not None:
            details["speculative"] = self.speculative.described()
            # what a pass is measured to cost here; suffix decoding's sequences kept
            details["drafting"] = {"cost": self.cost.described(),
                                   **({"kept": self.suffix.stats()} if self.suffix is not None else {})}
        return details

    async def close(self) -> None:
        if await self._thread.close():  # nothing can use the context any more
            self.context.close()

    async def score(self, prompt_ids: list[int], answer_ids: list[int],
                    cache_salt: str | None = None) -> list[TokenScore]:
        """Teacher-forced scoring (scoring.py), in turn with the requests on the decode thread."""
        return await self._thread.run(partial(score_llama_cpp, self.context, self.reuse, prompt_ids, answer_ids,
                                              BATCH, cache_salt))

    def _decode(self, request: DecodeRequest, emit: Emit) -> None:
        with torch.inference_mode():
            self._run(request, emit)

    def _run(self, request: DecodeRequest, emit: Emit) -> None:
        context, vocab, sampling = self.context, self.vocab, request.sampling
        prompt, cancel = request.prompt_ids, request.cancel
        if len(prompt) + request.max_tokens > context.n_ctx:  # the engine checks first; this is the last guard
            raise BackendError(f"{len(prompt)} prompt tokens and {request.max_tokens} more do not fit in the "
                               f"context of {context.n_ctx}", status=400, code="context_length_exceeded")
        started = time.perf_counter()
        cached = self.reuse.prepare(prompt, request.keep_at, request.cache_salt)
        for start in range(cached, len(prompt), BATCH):  # a long prompt stops between batches when cancelled
            if cancel.is_set():
                emit(done_event("cancelled", 0, 0.0, cached_tokens=cached))
                return
            context.eval(prompt[start:start + BATCH])
        written = max(0, min(request.keep_at or len(prompt), len(prompt)) - cached) if self.reuse.max_tokens > 0 else 0
        generator = generator_for(sampling, CPU)
        penalties = Penalties(sampling, torch.from_numpy(context.logits(-1))) if sampling.penalised else None

        def choose(row) -> Choice:
            if sampling.greedy and penalties is None:  # the common case, without torch: see greedy_choice
                return greedy_choice(row)
            choice = next_token(torch.from_numpy(row), sampling, generator, penalties)
            if penalties is not None:
                penalties.add(choice.token_id)
            return choice

        choice = choose(context.logits(-1))
        emit(prefill_event(len(prompt), cached, time.perf_counter() - started))
        if self.speculative is None:
            run_tokens(request, vocab, emit, choice, lambda token_id: choose(context.step(token_id)),
                       cached=cached, written=written)
            return
        proposer = self.suffix.begin(prompt, request.conversation) if self.suffix is not None else None
        drafting = Drafting(self.speculative, context, prompt, sampling, generator, penalties, self.cost, proposer)
        cost, clock = self.cost, time.perf_counter

        def timed_step(token_id: int) -> Choice:  # a plain step's time is what a pass is weighed against
            begun = clock()
            chosen = choose(context.step(token_id))
            cost.stepped(clock() - begun)
            return chosen

        try:
            run_tokens(request, vocab, emit, choice, timed_step, drafting=drafting, cached=cached, written=written)
        finally:
            if proposer is not None:
                proposer.finish()


class Drafting:
    """Speculative decoding on llama.cpp: the last token and the drafts worth their cost go in as one
    batch with logits for every position, speculative.judge accepts by the local backend's rules,
    and the KV cache is cut back to the tokens that stood. Drafts come from prompt lookup or from
    suffix decoding (`proposer`); how many a pass carries is PassCost's choice, from each draft's
    chance of standing (suffix decoding's own frequencies; prompt lookup's record in this request)."""

    def __init__(self, config: SpeculativeConfig, context: LlamaContext, prompt_ids: list[int], sampling,
                 generator, penalties, cost: PassCost, proposer=None) -> None:
        self.context, self.sampling, self.generator, self.penalties = context, sampling, generator, penalties
        self.method = config.method
        self.lookup = proposer or PromptLookup(prompt_ids, config.prompt_lookup_min, config.prompt_lookup_max)
        self.backoff = Backoff(config.num_speculative_tokens)
        self.cost = cost
        # What stood in this request: prompt lookup's chances (from 0.8 a draft, each as likely as the one
        # before it), the most suffix decoding's own estimates are trusted (from 0.95).
        self.record = Acceptance(config.num_speculative_tokens, 0.95) if proposer is not None else \
            Acceptance(config.num_speculative_tokens, 0.8, decay=True)
        self.drafts = self.drafted = self.accepted = 0

    def seen(self, token: int) -> None:
        self.lookup.append(token)

    def step(self, last: int, room: int) -> list[tuple]:
        """As the local backend's Drafting.step: the next tokens as (choice, drafted, accepted), or []
        when there is nothing worth drafting."""
        length = min(self.backoff.next_length(), room - 1)
        if length > 0 and not self.cost.length([1.0] * length):
            length = 0  # not even certain drafts would pay for their pass now: none are looked for
        drafts = self.lookup.propose(length) if length > 0 else []
        if drafts:
            drafts = drafts[:self.cost.length(chances_of(self.lookup, self.record, len(drafts)))]
            if not drafts:
                self.record.unverified()
        if not drafts:
            return []
        context, begun = self.context, time.perf_counter()
        held = len(context.ids)
        context.eval([last, *drafts], every_row=True)
        rows = [torch.from_numpy(context.logits(i)) for i in range(len(drafts) + 1)]
        out = judge(rows, drafts, self.sampling, self.generator, self.penalties)
        self.cost.passed(len(drafts) + 1, time.perf_counter() - begun)
        accepted = sum(stood for _, _, stood in out)
        context.cut(held + 1 + accepted)  # `last` and the drafts that stood; the next token goes in later
        self.record.record(len(drafts), accepted)
        self.backoff.record(accepted)
        self.drafts += 1
        self.drafted += len(drafts)
        self.accepted += accepted
        return out


def measured_cost(context: LlamaContext, rows: int = 9) -> PassCost:
    """A PassCost that starts from this machine's figures: a step and a pass of `rows` after 64
    tokens, medians of three (about 15 steps' time, once at load); the context is left empty."""
    probe = [100 + i for i in range(64)]
    context.eval(probe)
    times: dict[int, list[float]] = {1: [], rows: []}
    for _ in range(3):
        for n in times:
            begun = time.perf_counter()
            context.eval(probe[:n], every_row=n > 1)
            times[n].append(time.perf_counter() - begun)
            context.cut(len(probe))
    context.clear()
    step, passed = (sorted(times[n])[1] for n in (1, rows))
    return PassCost(min(max((passed / step - 1) / (rows - 1), 0.0), 4.0))


def same_vocabulary(context: LlamaContext, vocab: Vocabulary) -> None:
    """The GGUF's vocabulary must be the tokenizer's: llama.cpp reads looptrace's ids as they are."""
    pieces = vocab.pieces
    if context.n_vocab < len(pieces):
        raise ValueError(f"the GGUF's vocabulary has {context.n_vocab} tokens, the tokenizer {len(pieces)}: "
                         "it is not this model's tokenizer")
    differ = [i for i, piece in enumerate(pieces) if piece and piece.encode() != context.token_text(i)]
    if differ:
        shown = ", ".join(f"{i}: {pieces[i]!r} against {context.token_text(i).decode(errors='replace')!r}"
                          for i in differ[:3])
        raise ValueError(f"{len(differ)} of the tokenizer's {len(pieces)} tokens are not the GGUF's ({shown}): "
                         "it is not this model's tokenizer")


def _prepared(load: Callable[[], LlamaContext]) -> LlamaContext:
    # Sampling runs torch on this thread between llama.cpp's decodes: torch's own thread pool would
    # spin up beside llama.cpp's threads and fight them for the cores for a 50 µs softmax.
    torch.set_num_threads(1)
    return load()


class LlamaCppLoader(Loader):
    """MODEL is a GGUF file; --tokenizer may name the checkpoint whose tokenizer, template and config
    go with its weights (else the GGUF's own, read through transformers)."""

    def checkpoint_source(self) -> str:
        return self.settings.tokenizer or self.settings.model

    def context(self, asked: int | None, checkpoint: int) -> int:
        return asked or default_context(checkpoint)

    def load(self, model: TextModel) -> LlamaCppBackend:
        settings, gguf = self.settings, self.settings.model
        speculative = SpeculativeConfig.parse(settings.speculative_config) if settings.speculative_config else None
        if not Path(gguf).is_file():
            raise FileNotFoundError(f"--backend llama.cpp decodes a GGUF file, and {gguf} is not a file")
        threads = settings.threads or physical_cores()
        context = model.max_model_len
        log.info("llama.cpp: %s, %d threads, %d layers on the GPU, context %d", gguf, threads, settings.n_gpu_layers,
                 context)
        return LlamaCppBackend(lambda: LlamaContext(gguf, n_ctx=context, threads=threads,
                                                    n_gpu_layers=settings.n_gpu_layers),
                               model.vocab, max_queue=settings.max_queue,
                               prefix_cache_tokens=settings.prefix_cache_tokens,
                               prefix_cache_bytes=int(settings.prefix_cache_mb * 1024**2), speculative=speculative)
