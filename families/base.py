"""What every model family provides: rendering, stop tokens, sampling defaults and a parser.

A family wraps the checkpoint's own tokenizer and chat template; it never writes a prompt by hand.
The parser it makes turns the generated text into channel deltas (deltas.py): thinking, text, whole
tool calls, and markup that opened a call but was not one.

A tool call is emitted whole, once its closing marker has arrived: a call that is cut off or
malformed can then still be returned as text instead of as a half-sent call a client cannot undo.
"""

from __future__ import annotations

import importlib.util
import secrets
from dataclasses import dataclass
from typing import Any, Callable

from jinja2 import TemplateError

from .deltas import Delta
from .incremental import IncrementalEncoder
from .media.parts import MediaPart, has_media, lift_from_tool_results, placeholders_only, video_metadata
from .media.video_processor import sampler
from .prompt_items import ItemCosts, ItemCounts
from .prompt_length import PromptLength
from .render_windows import WHOLE, RenderWindows, Windowed
from .sanitize import mark_chat, mark_keys, treat_added_tokens_as_control

THOUGHT = "thought"
CONTENT = "content"
TOOL_CALL = "tool_call"


class RenderError(ValueError):
    """The chat template refused the conversation; its message is meant for the client (a 400)."""


class UnsupportedModel(ValueError):
    """No family knows this checkpoint's output format."""


def new_id(prefix: str) -> str:
    """An id for something the model produced (`call_…`, `chatcmpl-…`, `resp_…`): random, not a
    counter, because several looptrace processes may serve one conversation."""
    return prefix + secrets.token_hex(16)


class Parser:
    """Incremental parser fed the generated text piece by piece (pieces split anywhere).

    `channel` is where the text fed so far ends up: THOUGHT, CONTENT or TOOL_CALL.
    """

    channel: str = CONTENT

    def feed(self, text: str) -> list[Delta]:
        raise NotImplementedError

    def finish(self) -> list[Delta]:
        """Flush at the end of generation: held-back text, and an unfinished call as text."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Rendered:
    """A prompt as the model reads it."""

    text: str  # the exact string, control tokens included
    ids: list[int]
    thinking: bool  # the prompt leaves the model inside its thinking channel
    merged_system: int = 0  # later system messages joined into the first (Family.system_first_only)
    # How many of `ids` the conversation's next request will start with, the template replaying this
    # turn: all of them, unless the generation prompt ends with something history leaves out.
    history_length: int = 0
    # The processor's tensors for the media in the prompt (pixel values, grids, token types), for
    # the model's prefill; None for a prompt of text alone.
    media: dict | None = None
    # The prompt as the template alone writes it, each item one placeholder, for a server that
    # expands the items itself (vLLM); None unless asked for and the prompt holds media.
    template_ids: list[int] | None = None
    # Encoded from the conversation's previous prompt (families/incremental.py): that prompt's encoding
    # (its serial; 0: encoded whole), how many of `ids` and of `text`'s characters were taken from it,
    # and whether a whole encoding done to check this one agreed (None: not checked). `encoding`: this
    # prompt's own serial, which the next turn's `reused_from` names (0: not kept).
    encoding: int = 0
    reused_from: int = 0
    reused_ids: int = 0
    reused_chars: int = 0
    checked: bool | None = None
    # The template's text rendered how (render_windows.py; "" with media), and whether a whole rendering agreed.
    rendered_how: str = ""
    render_checked: bool | None = None


class Family:
    """Base class; one subclass per model family, chosen from config.json by `matches`.

    Subclasses name their tokens as strings (`stop_tokens`, `grammar_tokens`); the ids come from
    the checkpoint's own tokenizer, and tokens it lacks are skipped.
    """

    name: str = ""
    model_types: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()  # prefixes of config.json "architectures" entries
    stop_tokens: tuple[str, ...] = ()
    grammar_tokens: tuple[str, ...] = ()  # special tokens the parser needs to see as text
    card_sampling: dict[bool, dict] = {}  # thinking → temperature, top_p, top_k
    media_tokens: dict[str, str] = {}  # placeholder token → "image" | "video" | "audio", counted in traces
    processor_class: str = ""  # transformers' multimodal processor for the family, when it takes media
    tool_result_media: bool = True  # the template renders images inside a tool's output
    # What a generation prompt may end with that the template leaves out when it replays the turn
    # (Gemma 4's empty thought channel with thinking off): the local prefix cache keeps the state before it.
    transient_prompt_tail: str = ""
    # The template refuses a system message anywhere but first, while agents send them later (codex's
    # developer messages): those are joined into the first, in order, instead of failing the request.
    system_first_only: bool = False
    # What the template writes where a model's turn ends, each an added token (the one the model samples to
    # stop, or the one the template writes after a call): where token continuity cuts (continuity.py).
    turn_end_tokens: tuple[str, ...] = ()
    # A new message of these roles rewrites earlier turns (where reasoning is kept): its turn is rendered whole.
    rewrites_roles: frozenset[str] = frozenset({"user", "system", "developer"})
    # Per checkpoint, set in __init__:
    stop_token_ids: frozenset[int]
    grammar_ids: frozenset[int]  # the generation layer passes on only these special tokens' text

    def __init__(self, tokenizer: Any, generation_config: dict | None = None, processor: Any = None) -> None:
        """`processor`: the checkpoint's processor for images, and video and audio where it has their
        processors (families/media/processor.py), or None for a model that reads text only."""
        self.tokenizer = tokenizer
        self.processor = processor
        extractor = getattr(processor, "feature_extractor", None)
        self.audio_rate = getattr(extractor, "sampling_rate", 0)
        self.video_processor = getattr(processor, "video_processor", None)
        kinds = {"image"} | ({"audio"} if extractor else set()) | ({"video"} if self.video_processor else set())
        self.media_kinds = frozenset() if processor is None else frozenset(kinds)
        # How the processor samples a video's frames, so that only those are decoded.
        self.sample_video = sampler(self.video_processor) if self.video_processor is not None else None
        self.generation_config = generation_config or {}
        tok = getattr(tokenizer, "tokenizer", None)  # a processor wraps its tokenizer
        tok = tok if hasattr(tok, "convert_tokens_to_ids") else tokenizer
        self.stop_token_ids = frozenset(self._stop_ids(tok))
        self.grammar_ids = frozenset(i for i in (token_id(tok, t) for t in self.grammar_tokens) if i is not None)
        self.media_ids = {i: kind for i, kind in ((token_id(tok, t), k) for t, k in self.media_tokens.items())
                          if i is not None}
        self._control = treat_added_tokens_as_control(tok)
        self.encoder = IncrementalEncoder(tok, 0)  # prompts encoded whole until keep_encodings says otherwise
        self.windows = RenderWindows(0)  # and rendered whole
        self._length = PromptLength(tok)
        self._item_costs: ItemCosts | None = None  # measured on the template when first needed

    @classmethod
    def matches(cls, config: dict) -> bool:
        text_config = config.get("text_config")
        inner = text_config.get("model_type") if isinstance(text_config, dict) else None
        return config.get("model_type") in cls.model_types or inner in cls.model_types

    @classmethod
    def matches_architecture(cls, config: dict) -> bool:
        archs = config.get("architectures") or []
        return any(isinstance(a, str) and a.startswith(cls.architectures) for a in archs)

    def render(self, messages: list[dict], tools: list[dict] | None = None,
               enable_thinking: bool | None = None, template_ids: bool = False, media: bool | None = None,
               conversation: str | None = None, salt: str | None = None) -> Rendered:
        """Render with the checkpoint's own template; the text is decoded back from the ids.
        `template_ids`: also the ids before the processor expands the items (Rendered.template_ids).
        `media`: whether the messages hold decoded items, as the request's media plan says (None: look).
        `conversation`: whose previous prompt to encode from (incremental.py; a prompt of text alone);
        `salt`: the tenant's (DecodeRequest.cache_salt): no prompt kept under another is encoded from."""
        extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        merged = 0
        if self.system_first_only:
            messages, merged = merge_system_messages(messages)
        with_media = self.processor is not None and (has_media(messages) if media is None else media)
        if not with_media and self.encoder.enabled:
            return self._render_text(messages, tools, extra, merged, conversation, salt)
        if self._control is not None:  # keys too (sanitize.py); transformers marks the values
            messages, tools = mark_keys(messages, self._control), mark_keys(tools, self._control)
        if with_media:  # the processor writes each item's tokens where the template puts it
            # Torch tensors for a model here; numpy where torch was kept out (a relay, whose server
            # expands the items itself: proxy/engine/model_runtime.py).
            extra["return_tensors"] = "pt" if importlib.util.find_spec("torch") else "np"
            if not self.tool_result_media:
                messages = lift_from_tool_results(messages)
            messages, videos = video_metadata(messages)
            if videos:  # frames were sampled while decoding, as the processor samples them
                extra["processor_kwargs"] = {"video_metadata": videos, "do_sample_frames": False}
        unexpanded = None
        try:
            # sanitize: a control token typed by a user or returned by a tool is encoded as text,
            # so it cannot close a turn or open a tool call.
            encoded = (self.processor if with_media else self.tokenizer).apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=True,
                return_dict=True, sanitize_control_tokens=True, **extra)
            if with_media and template_ids:  # the same template, each item left as its one placeholder
                plain = {k: v for k, v in extra.items() if k not in ("return_tensors", "processor_kwargs")}
                unexpanded = self.tokenizer.apply_chat_template(
                    placeholders_only(messages), tools=tools or None, add_generation_prompt=True, tokenize=True,
                    return_dict=True, sanitize_control_tokens=True, **plain)["input_ids"]
        except TemplateError as exc:
            raise RenderError(exc.message or str(exc)) from exc
        except ValueError as exc:  # an empty conversation, say
            raise RenderError(str(exc)) from exc
        except RecursionError as exc:  # the API bounds nesting; a template may recurse deeper still
            raise RenderError("the conversation is nested too deeply for the chat template") from exc
        ids = encoded["input_ids"]
        if with_media:
            ids = ids[0].tolist()
        else:
            ids = list(ids[0] if ids and isinstance(ids[0], list) else ids)  # a processor batches
        # Decoded from the ids, so the stored prompt is exactly what the model read.
        text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        media = {k: v for k, v in encoded.items()
                 if k not in ("input_ids", "attention_mask", "video_metadata")} if with_media else None
        return Rendered(text=text, ids=ids, thinking=self.prompt_leaves_thinking(text), merged_system=merged,
                        history_length=len(ids) - self.transient_tail_length(text, ids), media=media,
                        template_ids=list(unexpanded) if unexpanded is not None else None)

    def _render_text(self, messages: list[dict], tools: list[dict] | None, extra: dict, merged: int,
                     conversation: str | None, salt: str | None = None) -> Rendered:
        """A prompt of text alone, as `apply_chat_template(..., sanitize_control_tokens=True)` renders and
        encodes it, in its two halves: the template's text, with the client's control tokens marked as
        transformers marks them, then that text encoded from where it departs from the conversation's
        previous prompt (incremental.py)."""
        try:
            windowed = self.conversation_chat(messages, tools, extra, conversation)
            encoding, reuse = self.encoder.encode(windowed.text, conversation, salt)
        except TemplateError as exc:
            raise RenderError(exc.message or str(exc)) from exc
        except ValueError as exc:  # an empty conversation, say
            raise RenderError(str(exc)) from exc
        except RecursionError as exc:
            raise RenderError("the conversation is nested too deeply for the chat template") from exc
        ids, text = encoding.ids.tolist(), encoding.text
        return Rendered(text=text, ids=ids, thinking=self.prompt_leaves_thinking(text), merged_system=merged,
                        history_length=len(ids) - self.transient_tail_length(text, ids),
                        encoding=encoding.serial, reused_from=reuse.base, reused_ids=reuse.ids,
                        reused_chars=reuse.chars, checked=reuse.checked, rendered_how=windowed.how,
                        render_checked=windowed.checked)

    def conversation_chat(self, messages: list[dict], tools: list[dict] | None, extra: dict,
                          conversation: str | None) -> Windowed:
        """`marked_chat` for a conversation's turn, rendered from what it adds where render_windows.py
        proves the splice."""
        if conversation is None or not self.windows.enabled:
            return Windowed(self.marked_chat(messages, tools, extra), WHOLE)
        return self.windows.render(conversation, messages, tools, extra,
                                   lambda chat, generation: self.marked_chat(chat, tools, extra, generation))

    def marked_chat(self, messages: list[dict], tools: list[dict] | None, extra: dict,
                    generation_prompt: bool = True) -> str:
        """The template's text for a chat of text alone, the client's control tokens marked as transformers
        marks them (what `encode_marked_chat` reads). Raises the template's own errors."""
        return self.tokenizer.apply_chat_template(
            mark_chat(messages, self._control), tools=mark_chat(tools, self._control) or None,
            add_generation_prompt=generation_prompt, tokenize=False, **extra)

    def keep_encodings(self, max_bytes: int, check_every: int, windows: bool = True) -> None:
        """Encode each prompt from its conversation's previous one (incremental.py), keeping up to
        `max_bytes` of them (0: every prompt encoded whole); every `check_every`-th such encoding is
        checked against a whole one (0: never). `windows`: render the template's text from what a turn
        adds too (render_windows.py, within the same bound and checked as often)."""
        self.encoder = IncrementalEncoder(self._tokenizer_itself(), max_bytes, check_every)
        self.windows = RenderWindows(max_bytes if windows else 0, check_every, self.rewrites_roles)

    def _tokenizer_itself(self) -> Any:
        tok = getattr(self.tokenizer, "tokenizer", None)  # a processor wraps its tokenizer
        return tok if hasattr(tok, "convert_tokens_to_ids") else self.tokenizer

    def encode_as_text(self, text: str) -> list[int]:
        """Text a client typed outside any message (a fork's replacement) as tokens, every control token
        in it, marked special or not, encoded as plain text: what the template's sanitizing does to a
        message, by transformers' own marking and encoder. (`split_special_tokens` splits special tokens
        only; Qwen's <tool_call> and <think> are added tokens that are not special.)"""
        return self._encode_around(lambda mark: mark(text))

    def forced_call_ids(self, name: str | None, thinking: bool) -> list[int]:
        """`forced_call_prefix` as tokens: the family's markup as its control tokens, and the name a
        client chose (tool_choice) as plain text whatever it holds, so that `f<|im_end|>` cannot end the
        turn. (The APIs refuse such names too: proxy/api/validation.py.)"""
        return self._encode_around(lambda mark: self.forced_call_prefix(mark(name) if name else None, thinking))

    def _encode_around(self, write: Callable[[Callable[[str], str]], str]) -> list[int]:
        """The tokens of text looptrace writes around a client's strings: `write(mark)` returns it, each
        client string passed through `mark`; control tokens in those are encoded as text, by
        transformers' own marking and encoder (what the template's sanitizing does to a message)."""
        from transformers.utils.chat_template_utils import encode_marked_chat, mark_control_tokens

        tok = getattr(self.tokenizer, "tokenizer", None)  # a processor wraps its tokenizer
        tok = tok if hasattr(tok, "convert_tokens_to_ids") else self.tokenizer
        if self._control is None:
            return tok.encode(write(lambda text: text), add_special_tokens=False)
        return encode_marked_chat(tok, write(lambda text: mark_control_tokens(text, self._control)))

    def runs_of(self, part: MediaPart) -> int:
        """How many runs of placeholder tokens an item becomes: a video one per frame, or per
        temporal patch of frames (Qwen3.5's two), with each one's timestamp between them."""
        if part.kind != "video":
            return 1
        step = getattr(self.video_processor, "temporal_patch_size", None) or 1
        return -(-part.info["frames"] // step)

    def tokens_beyond(self, messages: list[dict], limit: int, tools: list[dict] | None = None,
                      media_tokens: int = 0, counts: ItemCounts | None = None) -> int:
        """Before rendering: a lower bound on the prompt's tokens when it is sure to pass `limit`, else 0;
        a TooManyItems past an item kind's limit (prompt_items.py). `media_tokens`: what the attached
        items will become, as their headers say (media/plan.py); `counts`: the items, if counted already."""
        counts = counts if counts is not None else ItemCounts(messages, tools)
        return self._length.beyond(messages, limit, self.item_costs().tokens(counts) + media_tokens)

    def item_costs(self) -> ItemCosts:
        """Each kind of item's least cost in tokens, measured on the template once (a few renders: the
        server asks at load, so that no request waits for it)."""
        if self._item_costs is None:
            self._item_costs = ItemCosts(lambda m, t: len(self.render(m, t).ids))
        return self._item_costs

    def transient_tail_length(self, text: str, ids: list[int]) -> int:
        tail = self.transient_prompt_tail
        if not tail or not text.endswith(tail):
            return 0
        for n in range(1, min(len(ids), 16) + 1):  # the few ids that spell the tail
            if self.tokenizer.decode(ids[-n:], skip_special_tokens=False) == tail:
                return n
        return 0

    def prompt_leaves_thinking(self, prompt: str) -> bool:
        return False

    def sampling_defaults(self, thinking: bool) -> dict:
        """The checkpoint's generation_config values where it has them, else the family's."""
        values = dict(self.card_sampling[bool(thinking)])
        config = self.generation_config
        for key in ("temperature", "top_p", "top_k"):
            if config.get(key) is not None:
                values[key] = config[key]
        if config.get("do_sample") is False:
            values["temperature"] = 0.0  # the checkpoint asks for greedy decoding
        return values

    def new_parser(self, tools: list[dict] | None, thinking: bool) -> Parser:
        """A parser for one generation; `tools` in OpenAI shape (None: none offered).

        `thinking` is `Rendered.thinking`: whether output starts inside the thinking channel.
        """
        raise NotImplementedError

    def forced_call_prefix(self, name: str | None, thinking: bool) -> str:
        """Text appended to the prompt (and fed to the parser first) that starts a tool call:
        any call for `tool_choice: "required"` (name None), else the named function.

        `thinking` is whether thinking is on for the request (the enable_thinking rendered).
        """
        raise NotImplementedError

    def _stop_ids(self, tok: Any) -> set[int]:
        ids: set[int] = set()
        eos = self.generation_config.get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
        if isinstance(getattr(tok, "eos_token_id", None), int):
            ids.add(tok.eos_token_id)
        ids.update(i for i in (token_id(tok, t) for t in self.stop_tokens) if i is not None)
        return ids


def token_id(tokenizer: Any, token: str) -> int | None:
    """The id of `token` as one token of this vocabulary, or None (never the unknown token)."""
    added = getattr(tokenizer, "added_tokens_encoder", None) or {}
    if token in added:
        return added[token]
    try:
        i = tokenizer.convert_tokens_to_ids(token)
    except (KeyError, ValueError, TypeError):
        return None
    if isinstance(i, int) and tokenizer.convert_ids_to_tokens(i) == token:
        return i
    return None


def merge_system_messages(messages: list[dict]) -> tuple[list[dict], int]:
    """Every system message joined into one, first: (messages, how many were moved to join it).

    Moved, not turned into user turns: a template keeps an agent turn's earlier reasoning only after
    the last user message, so a user turn in the middle of the agent's work would change what the
    model reads of it. Contents are joined with a blank line, in their order.
    """
    systems = [m for m in messages if m.get("role") == "system"]
    if not systems or (len(systems) == 1 and messages[0] is systems[0]):
        return messages, 0
    contents = [m.get("content") or "" for m in systems]
    if all(isinstance(c, str) for c in contents):
        content: str | list = "\n\n".join(contents)
    else:  # content parts: the strings become text parts
        content = []
        for c in contents:
            if content:
                content.append({"type": "text", "text": "\n\n"})
            content.extend([{"type": "text", "text": c}] if isinstance(c, str) else c)
    moved = len(systems) - (messages[0] is systems[0])
    return [{**systems[0], "content": content}, *(m for m in messages if m.get("role") != "system")], moved
