"""A Responses request body → a `GenerationRequest`, plus the map from the tool names the model sees
back to the client's tools.

Input items become messages in Hugging Face's common format, as the Chat Completions adapter makes
them: calls in a row (with the reasoning and text before them) are one assistant turn, and their
outputs are tool messages. The model sees every tool as a function: a `custom` tool (codex's
apply_patch) takes one string parameter `input`, and a `namespace` tool's functions are offered as
`namespace.tool`. Tools that nothing here can run (web search, tool search) are dropped, never
refused, because clients send them whatever the model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from dataclasses import field as dc_field
from functools import cached_property

from pydantic import TypeAdapter, ValidationError

from ....engine.request import GenerationRequest
from ...errors import invalid
from ...protocol import parse, refusal
from ...request_parts import at_most, call_arguments, joined, media_note, media_part, parse_tool_choice, warn_once
from .fields import echoed
from .protocol import (
    CallOutput,
    Compaction,
    CompactionTrigger,
    CustomTool,
    CustomToolCall,
    FunctionCall,
    FunctionTool,
    Item,
    MediaPart,
    Message,
    NamespaceTool,
    OtherItem,
    Reasoning,
    RefusalPart,
    ResponsesRequest,
    TextPart,
    ToolChoice,
)

log = logging.getLogger("looptrace")

REASONING, TEXT, CALLS = 0, 1, 2  # the order of an assistant turn (an item that goes back starts a new one)


@dataclass(frozen=True, slots=True)
class ToolRef:
    """A client tool behind the name the model calls."""

    kind: str  # "function" | "custom"
    name: str
    namespace: str | None = None


class ToolNames:
    """Flat names offered to the model ↔ the client's tools."""

    def __init__(self) -> None:
        self.by_flat: dict[str, ToolRef] = {}
        self._bare: dict[str, list[str]] = {}

    def add(self, flat: str, ref: ToolRef) -> None:
        self.by_flat[flat] = ref
        self._bare.setdefault(ref.name, []).append(flat)

    def flat(self, name: str) -> str | None:
        """The flat name the model meant: itself, `namespace::tool`, or a bare name that is unique."""
        if name in self.by_flat:
            return name
        if "::" in name and (dotted := name.replace("::", ".", 1)) in self.by_flat:
            return dotted
        flats = self._bare.get(name, ())
        return flats[0] if len(flats) == 1 else None

    def resolve(self, name: str) -> ToolRef | None:
        flat = self.flat(name)
        return self.by_flat[flat] if flat is not None else None


@dataclass
class ResponsesOptions:
    model: str
    stream: bool
    store: bool
    request: ResponsesRequest
    previous: list | None = None  # the stored conversation it continues, as items
    echo: dict = dc_field(default_factory=dict)  # request fields the response object repeats
    token_messages: bool = False  # vLLM's enable_response_messages: the prompt's and the answer's ids

    @cached_property
    def items(self) -> list:
        """The conversation as Responses items, the previous response's included, as the client wrote them
        (for the store: made only when a response is kept)."""
        given = [item.model_dump(exclude_unset=True) for item in self.request.items]
        if isinstance(self.request.input, str):
            given = [{"type": "message", "role": "user", "content": self.request.input}]
        return [*(self.previous or ()), *given]


_STORED_ITEMS = TypeAdapter(list[Item])


@dataclass(frozen=True, slots=True)
class Previous:
    """The conversation a request continues (its previous_response_id's, output included): as stored,
    and as the models it is rendered from, read once for the turn."""

    stored: list
    items: list

    @classmethod
    def of(cls, stored: list | None) -> Previous | None:
        if not stored:
            return None
        try:
            return cls(stored, _STORED_ITEMS.validate_python(stored))
        except ValidationError as exc:  # what a request once sent, or this server's answer: said as the request's
            raise refusal(exc, "previous_response_id") from None


def parse_responses(body: dict, previous: list | Previous | None = None,
                    compacting=None) -> tuple[GenerationRequest, ResponsesOptions, ToolNames]:
    """A body parsed (once: parse(ResponsesRequest, body)) and converted; see `converted`."""
    previous = previous if isinstance(previous, Previous) or previous is None else Previous.of(previous)
    return converted(parse(ResponsesRequest, body), previous, compacting)


def converted(body: ResponsesRequest, previous: Previous | None = None,
              compacting=None) -> tuple[GenerationRequest, ResponsesOptions, ToolNames]:
    """The model → the engine's request. `previous`: the conversation of `previous_response_id`;
    `compacting`: what the request asks of compaction, its compaction items expanded (compaction/plan.py's
    Plan)."""
    given = at_most(body.items, "messages", "input")
    items = [*previous.items, *given] if previous is not None else given
    tools, names = parse_response_tools(at_most(body.tools or [], "tools", "tools"))
    tool_choice = _tool_choice(body.tool_choice, tools, names)
    if body.top_p is not None and not 0 < body.top_p <= 1:
        raise invalid(f"Invalid value for 'top_p': {body.top_p} must be greater than 0 and at most 1.", param="top_p")
    if body.background:
        raise invalid("Background mode is not supported by this server: send the request without 'background' "
                      "(or stream it).", param="background", code="unsupported_parameter")
    reasoning = body.reasoning
    effort = reasoning.effort if reasoning is not None else None
    parallel = body.parallel_tool_calls is not False
    messages = to_messages(items, body.instructions, names, compacting)
    if not messages:
        raise invalid("Missing required parameter: 'input'.", param="input", code="missing_required_parameter")
    request = GenerationRequest(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        enable_thinking=None if effort is None else effort != "none",
        max_tokens=body.max_output_tokens,
        max_tokens_param="max_output_tokens",
        temperature=body.temperature,
        top_p=body.top_p,
    )
    request.presence_penalty = body.presence_penalty or 0.0
    request.frequency_penalty = body.frequency_penalty or 0.0
    store = body.store is not False
    text_format = body.text.format if body.text is not None else None
    echo = echoed(body, instructions=body.instructions, max_output_tokens=body.max_output_tokens,
                  parallel_tool_calls=parallel, reasoning={"effort": effort, "summary": reasoning and reasoning.summary},
                  temperature=body.temperature, top_p=body.top_p, text={"format": text_format or {"type": "text"}},
                  store=store)
    options = ResponsesOptions(model=body.model, stream=bool(body.stream), store=store, request=body,
                               previous=previous.stored if previous is not None else None, echo=echo, token_messages=bool(body.enable_response_messages))
    return request, options, names


# -- tools --

def parse_response_tools(tools: list) -> tuple[list[dict] | None, ToolNames]:
    """Responses tools → OpenAI function tools as the family renders them, and the name map."""
    names = ToolNames()
    out: list[dict] = []
    for i, tool in enumerate(tools):
        if isinstance(tool, NamespaceTool):
            for j, member in enumerate(tool.tools):
                _offer(member, f"tools[{i}].tools[{j}]", out, names, tool.name)
        else:
            _offer(tool, f"tools[{i}]", out, names, None)
    return out or None, names


def _offer(tool, where: str, out: list, names: ToolNames, namespace: str | None) -> None:
    if not isinstance(tool, (FunctionTool, CustomTool)):
        warn_once(f"tool:{tool.type}", "dropping %s tools: nothing on this server can run them", tool.type)
        return
    flat = f"{namespace}.{tool.name}" if namespace else tool.name
    if flat in names.by_flat:
        raise invalid(f"Duplicate tool name {flat!r} in 'tools'.", param=f"{where}.name")
    if isinstance(tool, FunctionTool):
        parameters = tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}}
    else:
        parameters = _custom_parameters(tool)
    spec: dict = {"name": flat}
    if tool.description is not None:
        spec["description"] = tool.description
    spec["parameters"] = parameters
    out.append({"type": "function", "function": spec})
    names.add(flat, ToolRef(tool.type, tool.name, namespace))


def _custom_parameters(tool: CustomTool) -> dict:
    """A free-form tool as a function of one string; its grammar, if any, goes in the description of
    that string, since the model can only follow what it is shown."""
    fmt = tool.format
    input_doc = "The tool's whole input, as free-form text."
    if fmt is not None and fmt.type == "grammar" and isinstance(fmt.definition, str):
        input_doc = f"The tool's whole input, as text matching this {fmt.syntax or ''} grammar:\n{fmt.definition}"
    return {"type": "object", "properties": {"input": {"type": "string", "description": input_doc}},
            "required": ["input"]}


def _tool_choice(choice: str | ToolChoice | None, tools: list[dict] | None, names: ToolNames) -> str | dict:
    if isinstance(choice, ToolChoice):
        kind, name = choice.type, choice.name
        if kind == "allowed_tools":
            return parse_tool_choice(choice.mode if isinstance(choice.mode, str) else "auto", tools)
        if kind in ("function", "custom") or (kind is None and name is not None):
            if isinstance(name, str) and isinstance(choice.namespace, str):
                name = f"{choice.namespace}.{name}"
            flat = names.flat(name) if isinstance(name, str) else None
            return parse_tool_choice({"name": flat or name}, tools)
        if isinstance(kind, str):
            warn_once(f"choice:{kind}", "tool_choice %r names a tool this server dropped; using 'auto'", kind)
            return "auto"
        return parse_tool_choice(choice.model_dump(exclude_unset=True), tools)
    if choice == "required" and not tools:
        return "auto"  # the only tools were dropped ones: nothing left to require
    return parse_tool_choice(choice, tools)


# -- input items → messages --

def to_messages(items: list, instructions: str | None, names: ToolNames, compacting=None) -> list[dict]:
    """Responses items (models) → Hugging Face messages.

    System and developer messages before the first other item, with `instructions` first, become
    one system message: templates take the system prompt from the first message only, and codex
    sends several developer messages. Later ones stay where they are, as system messages; a family
    whose template refuses that joins them into the first (Family.system_first_only).
    """
    out = _Messages(instructions)
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if isinstance(item, Message):
            if out.message(item, where):
                continue  # a leading system message: more may follow
        elif isinstance(item, (FunctionCall, CustomToolCall)):
            out.call(item, where)
        elif isinstance(item, CallOutput):
            out.output(item, where)
        elif isinstance(item, Reasoning):
            out.reasoning(reasoning_text(item))
        elif isinstance(item, (Compaction, CompactionTrigger)) and compacting is not None:
            compacting.render(item, out)  # a summary asked for, or one given back: compaction/plan.py
        else:
            text = item.loose_text() if isinstance(item, OtherItem) else ""
            if not text:
                log.warning("skipping input item %d of type %r: nothing here can replay it", i, item.type)
                continue
            out.said("assistant" if getattr(item, "role", None) == "assistant" else "user", text)
        out.leading = False
    return out.messages()


class _Messages:
    """The messages being gathered from items: assistant turns (reasoning, then text, then calls; an
    item that goes back starts a new turn), tool results named after their calls, the leading system
    text apart."""

    def __init__(self, instructions: str | None) -> None:
        self.system: list[str] = [instructions] if instructions else []
        self.out: list[dict] = []
        self.turn: dict | None = None  # the assistant turn being gathered
        self.stage = REASONING  # how far that turn has got: REASONING, TEXT, CALLS
        self.call_names: dict[str, str] = {}  # call_id → the name the model called, for tool messages
        self.leading = True  # no item but system messages yet

    def assistant(self, step: int) -> dict:
        if self.turn is None or step < self.stage:
            self.turn = {"role": "assistant", "content": ""}
            self.out.append(self.turn)
        self.stage = step
        return self.turn

    def said(self, role: str, text) -> None:
        if role == "assistant":
            self.assistant(TEXT)["content"] += text
        else:
            self.out.append({"role": role, "content": text})
            self.turn = None

    def message(self, item: Message, where: str) -> bool:
        """True when it joined the leading system text."""
        role = item.role
        # Images go to the model from a user's message; elsewhere (a system prompt, the assistant's own
        # words) they are noted as text.
        text = content_text(item.content, f"{where}.content", media=role == "user")
        if role in ("system", "developer") and self.leading:
            self.system.append(text)
            return True
        self.said("system" if role == "developer" else role, text)
        return False

    def call(self, item: FunctionCall | CustomToolCall, where: str) -> None:
        flat = f"{item.namespace}.{item.name}" if item.namespace else item.name
        if isinstance(item, FunctionCall):
            arguments = call_arguments(item.arguments, f"{where}.arguments")
        else:
            arguments = {"input": item.input or ""}
        self.call_names[item.call_id] = flat
        self.assistant(CALLS).setdefault("tool_calls", []).append(
            {"id": item.call_id, "type": "function", "function": {"name": flat, "arguments": arguments}})

    def output(self, item: CallOutput, where: str) -> None:
        message = {"role": "tool", "content": content_text(item.output, f"{where}.output", media=True),
                   "tool_call_id": item.call_id}
        if item.call_id in self.call_names:
            message["name"] = self.call_names[item.call_id]
        self.out.append(message)
        self.turn = None

    def reasoning(self, text: str) -> None:
        current = self.assistant(REASONING)
        if text:
            previous = current.get("reasoning_content")
            current["reasoning_content"] = f"{previous}\n\n{text}" if previous else text

    def messages(self) -> list[dict]:
        if self.system:
            return [{"role": "system", "content": "\n\n".join(self.system)}, *self.out]
        return self.out


def content_text(content: str | list | None, param: str, media: bool = False) -> str | list[dict]:
    """A message's content, or a tool output: a string, or parts joined as the Chat adapter joins them.
    With `media` (a user's message, a tool's output), images are kept as parts; otherwise each becomes
    a note."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, RefusalPart):
            texts.append(part.refusal)
        elif isinstance(part, MediaPart):
            texts.append(media_part(part, f"{param}[{j}]") if media else media_note())
    return joined(texts)


def reasoning_text(item: Reasoning) -> str:
    """The reasoning's own text, else its summary; `encrypted_content` means nothing here."""
    for parts, kinds in ((item.content, ("reasoning_text", "text")), (item.summary, ("summary_text",))):
        if parts:
            texts = [p.text for p in parts if p.type in kinds and isinstance(p.text, str)]
            if texts:
                return "\n\n".join(texts)
    return ""
