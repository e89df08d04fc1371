"""One request's run, whatever API it came from: render → decode → parse.

The API adapters build a `GenerationRequest`, then iterate `Generation.run()`, which yields a
`Step` per backend token: the token event, the channel it fell in, and the deltas its text produced.
Observers (spans, metrics: observer.py) see the same events; like everyone else, they never change
them, and what a tracer adds to the request (the trace context to forward) the engine sets.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

from looptrace.backends.base import DecodeRequest, SamplingParams
from looptrace.backends.events import DoneEvent, PrefillEvent
from looptrace.common.jsonio import dumps
from looptrace.families.base import THOUGHT, Rendered, RenderError
from looptrace.families.deltas import (
    Delta,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    UnparsedCallDelta,
    dispatch,
    text_delta,
    thinking_delta,
)
from looptrace.families.media.parts import MediaError, MediaPart, item_tokens
from looptrace.families.media.plan import MediaPlan
from looptrace.families.prompt_items import ItemCounts, TooManyItems

from . import turn_digests
from .continuity import Continuity, render_turn
from .errors import Refused
from .memory import LastTurn
from .observer import Observer
from .request import GenerationRequest, Step
from .runtime import Runtime
from .stops import StopStrings


class Generation:
    """One request's run on a loaded runtime (the API awaits `runtime.ready()` first)."""

    def __init__(self, runtime: Runtime, request: GenerationRequest, observers: tuple[Observer, ...] = ()) -> None:
        self.runtime = runtime
        self.request = request
        self.observers = tuple(observers)  # called in order, each with the same events
        self.rendered: Rendered | None = None
        self.prompt_ids: list[int] = []
        # Tokens after the rendered prompt that the answer starts with (a forced tool call's opening, a
        # fork's prefix), and their text, which the parser reads as the model's own words.
        self.forced_ids: list[int] = []
        self.forced_text = ""
        self.typed_text = ""  # the end of forced_text a client typed (StoredPrompt.typed)
        self.max_tokens = 0
        self.sampling = SamplingParams()
        # Filled in while running:
        self.prefill_event: PrefillEvent | None = None
        self.done_event: DoneEvent | None = None
        self.completion_tokens = 0
        self.reasoning_tokens = 0
        self.tool_calls: list[dict] = []
        self.reasoning: list[str] = []  # the answer as the client received it, for traces
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None  # the client's stop string that ended the answer, if one did
        self.media = MediaPlan([], [])  # the items the model reads, decoded (their info filled)
        self.media_parts: list[MediaPart] = []  # their parts
        self.media_runs: list[tuple[int, int, int]] = []  # (offset, span, count) of the tokens each one became
        self.continuity = Continuity()  # how the prompt continues the conversation's last (continuity.py)
        # The conversation's last turn as the engine remembers it (memory.py; None: none), read as the
        # prompt is rendered; what this request was asked (turn_digests.py), where continuity is on; and
        # the ids the model sampled: what the conversation's memory keeps of this turn.
        self.previous: LastTurn | None = None
        self.asked: turn_digests.Asked | None = None
        self.sampled_ids: list[int] = []
        self._decode: DecodeRequest | None = None
        self._screening = _Screening(self)

    # -- before any byte goes to the client: everything that can refuse the request --

    async def prepare(self) -> None:
        # Rendering and tokenizing a long agent conversation takes milliseconds: not on the event loop.
        # A short one takes less than the hop to a thread and back (0.7 ms to render a one-line chat
        # here; the hops cost as much again, and on a busy loop more), so it is rendered in place.
        if _renders_quickly(self.request):
            self._prepare()
        else:
            await asyncio.to_thread(self._prepare)

    def _prepare(self) -> None:
        runtime, request = self.runtime, self.request
        family = runtime.family
        tools = request.tools if request.tool_choice != "none" else None
        started_ns = time.time_ns()
        stored = request.stored
        if stored is not None:
            rendered = Rendered(text=runtime.tokenizer.decode(stored.ids), ids=stored.ids, thinking=stored.thinking,
                                history_length=len(stored.ids))
            self.forced_ids = list(stored.answer_prefix)
            generated = self.forced_ids[:len(self.forced_ids) - stored.typed]
            self.typed_text = self._text_of(stored.ids + generated, self.forced_ids[len(generated):]) \
                if stored.typed else ""
            self.forced_text = self._text_of(stored.ids, generated) + self.typed_text
        else:
            messages = self._checked_before_rendering(tools)
            mode = request.continuity or runtime.settings.token_continuity
            if request.memory is not None:
                self.previous = request.memory.last()
                if mode != "off":
                    self.asked = turn_digests.asked(request.messages, tools, request.enable_thinking)
            try:
                rendered, self.continuity = render_turn(
                    family, request, messages, tools, mode, self.previous, self.asked, media=bool(self.media),
                    template_ids=bool(self.media) and runtime.backend.expands_media)
            except RenderError as exc:
                raise Refused(f"the chat template refused these messages: {exc}", param="messages",
                              code="template_error") from exc
            forced_name = request.tool_choice.get("name") if isinstance(request.tool_choice, dict) else None
            if request.tools and (request.tool_choice == "required" or forced_name):
                thinking_on = bool(request.enable_thinking) or rendered.thinking
                self.forced_text = family.forced_call_prefix(forced_name, thinking_on)
                self.forced_ids = family.forced_call_ids(forced_name, thinking_on)
        ids = rendered.ids + self.forced_ids
        self.rendered, self.prompt_ids = rendered, ids
        if self.media_parts:  # found once, here: the prefix cache's key and the trace both read them
            self.media_runs = item_tokens(ids, family.media_ids, [family.runs_of(p) for p in self.media_parts])
        limit = runtime.max_model_len
        room = limit - len(ids)
        # A prompt refused for its length is traced by its size, not its text: what a refused request
        # stores stays small however much was sent.
        ended_ns = time.time_ns()
        for observer in self.observers:
            observer.rendered(self, started_ns, ended_ns, content=room > 0)
        if room <= 0:
            raise Refused(_too_long(limit, str(len(ids))), param="messages", code="context_length_exceeded")
        if request.max_tokens is not None and request.max_tokens > room:
            raise Refused(
                f"{request.max_tokens_param} is too large: {request.max_tokens_param} is {request.max_tokens}, but the "
                f"prompt already uses {len(ids)} of this model's {limit} tokens of context, leaving {room}.",
                param=request.max_tokens_param, code="context_length_exceeded",
            )
        self.max_tokens = request.max_tokens if request.max_tokens is not None else room

        defaults = family.sampling_defaults(rendered.thinking)
        if runtime.settings.sampling_defaults:  # the server's, over the checkpoint's
            defaults = {**defaults, **runtime.settings.sampling_defaults}
        self.sampling = SamplingParams(
            temperature=_pick(request.temperature, defaults.get("temperature"), 1.0),
            top_p=_pick(request.top_p, defaults.get("top_p"), 1.0),
            top_k=max(0, _pick(request.top_k, defaults.get("top_k"), 0)),
            seed=request.seed,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
        )

    def _checked_before_rendering(self, tools: list[dict] | None) -> list[dict]:
        """Everything that can refuse the conversation before it is rendered, cheapest first, or a 400
        saying what: first each PDF read as its pages' text (families/media/pdf.py), which all that
        follows counts as the text it is; every kind of item counted (families/prompt_items.py); the media
        this model and backend can take, within their limits, and the tokens their headers say the images
        will become; the prompt's lower bound, each item at its least cost through the template, against
        the context (families/prompt_length.py); then the media decoded. The conversation to render."""
        runtime, request = self.runtime, self.request
        family, limit, limits = runtime.family, runtime.max_model_len, runtime.media_limits
        plan = request.media
        try:
            if plan.pdfs:  # read as text first (on this thread, off the event loop): all that follows counts it
                request.messages = plan.with_pdf_text(request.messages)
            messages = request.messages
            counts = ItemCounts(request.messages, tools)
            if plan:
                messages, plan = plan.readable(messages, family.media_kinds, runtime.model_name)
            if plan:
                plan.check(limits, runtime.backend.media_refusal)
            media_tokens = plan.image_tokens(limits, family.processor) if plan else 0
            at_least = family.tokens_beyond(request.messages, limit, tools, media_tokens, counts)
        except MediaError as exc:
            raise Refused(str(exc), param=exc.param, code=exc.code) from exc
        except TooManyItems as exc:
            raise Refused(str(exc), param=exc.param, code="too_many_items") from exc
        if at_least:
            raise Refused(_too_long(limit, f"at least {at_least}"), param="messages", code="context_length_exceeded")
        if not plan:
            return messages
        try:  # on this thread, off the event loop
            messages = plan.decoded(messages, limits, family.audio_rate, family.sample_video)
        except MediaError as exc:
            raise Refused(str(exc), param=exc.param, code=exc.code) from exc
        self.media = plan
        self.media_parts = plan.parts
        return messages

    # -- the run --

    async def run(self) -> AsyncIterator[Step]:
        runtime, request = self.runtime, self.request
        family, observers = runtime.family, self.observers
        parser = family.new_parser(request.tools if request.tool_choice != "none" else None, self.rendered.thinking)
        grammar = family.grammar_ids
        stops = StopStrings(request.stop) if request.stop else None
        self._decode = DecodeRequest(self.prompt_ids, self.max_tokens, self.sampling, family.stop_token_ids,
                                     keep_at=self.rendered.history_length, media=self.rendered.media,
                                     # Which item fills which tokens: part of what the prompt is.
                                     media_key=self.media.cache_key(self.media_runs),
                                     template_ids=self.rendered.template_ids, conversation=request.conversation,
                                     cache_salt=request.cache_salt,
                                     media_urls=self.media.data_urls() if self.rendered.template_ids is not None
                                     else [])
        for observer in observers:  # what a tracer adds to the request (its traceparent), set here
            self._decode.trace_headers.update(observer.submitted(self, self._decode))

        if self.forced_text:
            # The prompt already holds the answer's opening; the parser must read it as the model's own
            # words, but for what a client typed, which is text whatever markup it holds.
            read = self.forced_text[:len(self.forced_text) - len(self.typed_text)]
            deltas = parser.feed(read) if read else []
            if self.typed_text:
                deltas.append((thinking_delta if parser.channel == THOUGHT else text_delta)(self.typed_text))
            yield Step(None, None, self._screen(deltas))

        stopped_by: str | None = None
        try:
            async for event in runtime.backend.generate(self._decode):
                kind = event["type"]
                if kind == "token":
                    deltas: list[dict] = []
                    text = event["text"]
                    # Special tokens outside the family's grammar (a stray <|im_start|>, say) are recorded
                    # in the trace but never shown as text.
                    if text and (not event["special"] or event["id"] in grammar):
                        if stops is not None:
                            text = stops.feed(text)
                        if text:
                            deltas = self._screen(parser.feed(text))
                    channel = parser.channel
                    self.sampled_ids.append(event["id"])
                    self.completion_tokens += 1
                    if channel == THOUGHT:
                        self.reasoning_tokens += 1
                    now_ns = time.time_ns()  # one clock read per token, whatever the observers
                    for observer in observers:
                        observer.token(event, channel, now_ns)
                    yield Step(event, channel, deltas)
                    if stops is not None and stops.hit:
                        stopped_by, self.stop_sequence = "stop", stops.matched
                        break
                    if self.tool_calls and not request.parallel_tool_calls:
                        stopped_by = "tool_calls"  # one call per turn was asked for: don't wait for more
                        break
                elif kind == "prefill":
                    self.prefill_event = event
                    for observer in observers:
                        observer.prefill(event)
                elif kind == "done":
                    self.done_event = event
                elif kind == "upstream":
                    for observer in observers:
                        observer.upstream(event)
        finally:
            self._decode.cancel.set()

        tail = parser.feed(stops.flush()) if stops is not None and not stops.hit else []
        tail = self._screen(tail + parser.finish())
        if tail:
            yield Step(None, None, tail)
        self.finish_reason = self._finish_reason(stopped_by)
        self._remember()
        for observer in observers:
            observer.finished(self)

    def _remember(self) -> None:
        """The conversation's memory keeps this turn, complete: before the client hears the end, so that
        the next turn finds it on any process."""
        memory = self.request.memory
        if memory is None or self.rendered is None:
            return
        digests = None
        if self.asked is not None:
            calls = [(call["name"], call["arguments"]) for call in self.tool_calls]
            digests = turn_digests.answered(self.asked, "".join(self.text), "".join(self.reasoning), calls)
        memory.keep(self.prompt_ids + self.sampled_ids, len(self.prompt_ids), self.rendered.encoding, digests)

    def cancel(self) -> None:
        if self._decode is not None:
            self._decode.cancel.set()

    def _text_of(self, context: list[int], ids: list[int]) -> str:
        """What the parser would have read of tokens had they been generated after `context`: grammar
        and plain tokens' text, not stray special tokens'."""
        vocab, grammar = self.runtime.vocab, self.runtime.family.grammar_ids
        detokenizer = vocab.detokenizer(context[-4:])
        texts = []
        for token_id in ids:
            text = detokenizer.step(token_id)
            if token_id not in vocab.special or token_id in grammar:
                texts.append(text)
        texts.append(detokenizer.flush())
        return "".join(texts)

    def _screen(self, deltas: list[Delta]) -> list[Delta]:
        """Record the answer as the client gets it (_Screening)."""
        return dispatch(deltas, self._screening) if deltas else deltas

    def _finish_reason(self, stopped_by: str | None) -> str:
        if stopped_by:
            return stopped_by
        backend_reason = self.done_event["finish_reason"] if self.done_event else "cancelled"
        if backend_reason == "stop" and self.tool_calls:
            return "tool_calls"
        return backend_reason

    # -- figures for usage and traces --

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def cache_write_tokens(self) -> int:
        return self.done_event["cache_write_tokens"] if self.done_event is not None else 0

    @property
    def cached_tokens(self) -> int:
        # `done` has the final word: a vLLM server says it only at the end.
        if self.done_event is not None:
            return self.done_event["cached_tokens"]
        return (self.prefill_event or {}).get("cached_tokens") or 0


RENDER_IN_PLACE_BYTES = 16_384  # a conversation this small (as JSON) renders in about a millisecond


def _renders_quickly(request: GenerationRequest) -> bool:
    if request.stored is not None:
        return len(request.stored.ids) < RENDER_IN_PLACE_BYTES // 4
    if request.media or request.media.pdfs:
        return False  # media is decoded while rendering, a PDF read: never on the event loop
    size = 0
    for item in (*request.messages, *(request.tools or ())):  # stops as soon as the bound is passed
        try:
            size += len(dumps(item))
        except (TypeError, ValueError):
            return False
        if size >= RENDER_IN_PLACE_BYTES:
            return False
    return True


def _too_long(limit: int, tokens: str) -> str:
    return (f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
            f"{tokens} tokens. Please reduce the length of the messages.")


def _pick(asked, default, fallback):
    if asked is not None:
        return asked
    return default if default is not None else fallback


class _Screening:
    """What a generation does with each delta (families/deltas.py's DeltaHandler): records the answer as
    the client gets it, shows tool calls to the observers, and with tool_choice "none" returns a call
    the model makes anyway as text. Each method returns the delta the client gets."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation

    def text(self, delta: TextDelta) -> Delta:
        self.generation.text.append(delta["text"])
        return delta

    def thinking(self, delta: ThinkingDelta) -> Delta:
        self.generation.reasoning.append(delta["text"])
        return delta

    def tool_call(self, delta: ToolCallDelta) -> Delta:
        generation = self.generation
        if generation.request.tool_choice == "none":
            return self.text(text_delta(delta["raw"]))
        generation.tool_calls.append(delta)
        for observer in generation.observers:
            observer.tool_call(delta)
        return delta

    def unparsed_call(self, delta: UnparsedCallDelta) -> Delta:
        for observer in self.generation.observers:
            observer.unparsed_call(delta)
        return delta
