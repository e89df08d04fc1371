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

from ....engine.request import GenerationRequest
from ...errors import invalid
from ...request_parts import (
    MEDIA_PARTS,
    at_most,
    call_arguments,
    joined,
    media_note,
    media_part,
    parse_tool_choice,
    temperature_and_top_p,
    warn_once,
)
from ...validation import describe, field, in_range, tool_name
from .fields import echoed, penalties

log = logging.getLogger("looptrace")

MESSAGE_ROLES = ("system", "developer", "user", "assistant")
CALL_ITEMS = ("function_call", "custom_tool_call")
OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")
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


@dataclass(slots=True)
class ResponsesOptions:
    model: str
    stream: bool
    store: bool
    items: list  # the conversation as Responses items (a previous response's included), for the store
    echo: dict = dc_field(default_factory=dict)  # request fields the response object repeats
    token_messages: bool = False  # vLLM's enable_response_messages: the prompt's and the answer's ids


def parse_responses(body: dict, previous_items: list | None = None,
                    compacting=None) -> tuple[GenerationRequest, ResponsesOptions, ToolNames]:
    """`previous_items`: the stored conversation of `previous_response_id`, its output included;
    `compacting`: what the request asks of compaction, its compaction items expanded (compaction.py's Plan)."""
    model = field(body, "model", str, "model", required=True)
    instructions = field(body, "instructions", str, "instructions")
    items = previous_items + _input(body) if previous_items else _input(body)
    tools, names = parse_response_tools(at_most(field(body, "tools", list, "tools") or [], "tools", "tools"))
    tool_choice = _tool_choice(body.get("tool_choice"), tools, names)

    max_tokens = field(body, "max_output_tokens", int, "max_output_tokens")
    in_range(max_tokens, "max_output_tokens", 1)
    temperature, top_p = temperature_and_top_p(body)
    reasoning = field(body, "reasoning", dict, "reasoning", default={})
    effort = field(reasoning, "effort", str, "reasoning.effort")
    text = field(body, "text", dict, "text", default={})
    field(text, "format", dict, "text.format")  # accepted; output is not constrained to it
    parallel = field(body, "parallel_tool_calls", bool, "parallel_tool_calls", default=True)
    for name, kind in (("prompt_cache_key", str), ("include", list), ("client_metadata", dict), ("metadata", dict)):
        field(body, name, kind, name)  # accepted, typed, otherwise unused

    messages = to_messages(items, instructions, names, compacting)
    if not messages:
        raise invalid("Missing required parameter: 'input'.", param="input", code="missing_required_parameter")
    request = GenerationRequest(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        enable_thinking=None if effort is None else effort != "none",
        max_tokens=max_tokens,
        max_tokens_param="max_output_tokens",
        temperature=temperature,
        top_p=top_p,
    )
    request.presence_penalty, request.frequency_penalty = penalties(body)
    stream = field(body, "stream", bool, "stream", default=False)
    store = field(body, "store", bool, "store", default=True)
    echo = echoed(body, instructions=instructions, max_output_tokens=max_tokens, parallel_tool_calls=parallel,
                  reasoning={"effort": effort, "summary": reasoning.get("summary")}, temperature=temperature,
                  top_p=top_p, text={"format": text.get("format") or {"type": "text"}}, store=store)
    options = ResponsesOptions(model=model, stream=stream, store=store, items=items, echo=echo,
                               token_messages=field(body, "enable_response_messages", bool, "enable_response_messages",
                                                    default=False))
    return request, options, names


def _input(body: dict) -> list:
    value = body.get("input")
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise invalid(f"Invalid type for 'input': expected a string or an array of items, but got {describe(value)}.",
                      param="input", code="invalid_type")
    for i, item in enumerate(at_most(value, "messages", "input")):
        if not isinstance(item, dict):
            raise invalid(f"Invalid type for 'input[{i}]': expected an object, but got {describe(item)}.",
                          param=f"input[{i}]", code="invalid_type")
    return value


# -- tools --

def parse_response_tools(tools: list | None) -> tuple[list[dict] | None, ToolNames]:
    """Responses tools → OpenAI function tools as the family renders them, and the name map."""
    names = ToolNames()
    out: list[dict] = []
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid(f"Invalid type for '{where}': expected an object.", param=where, code="invalid_type")
        kind = field(tool, "type", str, f"{where}.type", default="function")
        if kind == "namespace":
            namespace = _name(tool, where)
            members = field(tool, "tools", list, f"{where}.tools", default=[])
            for j, member in enumerate(members):
                at = f"{where}.tools[{j}]"
                if not isinstance(member, dict):
                    raise invalid(f"Invalid type for '{at}': expected an object.", param=at, code="invalid_type")
                _offer(member, at, out, names, namespace)
        elif kind in ("function", "custom"):
            _offer(tool, where, out, names, None)
        else:
            warn_once(f"tool:{kind}", "dropping %s tools: nothing on this server can run them", kind)
    return out or None, names


def _name(tool: dict, where: str) -> str:
    name = field(tool, "name", str, f"{where}.name", required=True)
    if not name:
        raise invalid(f"'{where}.name' must not be empty.", param=f"{where}.name")
    return tool_name(name, f"{where}.name")


def _offer(tool: dict, where: str, out: list, names: ToolNames, namespace: str | None) -> None:
    kind = field(tool, "type", str, f"{where}.type", default="function")
    if kind not in ("function", "custom"):
        warn_once(f"tool:{kind}", "dropping %s tools: nothing on this server can run them", kind)
        return
    name = _name(tool, where)
    flat = f"{namespace}.{name}" if namespace else name
    if flat in names.by_flat:
        raise invalid(f"Duplicate tool name {flat!r} in 'tools'.", param=f"{where}.name")
    description = field(tool, "description", str, f"{where}.description")
    if kind == "function":
        parameters = field(tool, "parameters", dict, f"{where}.parameters")
        parameters = parameters if parameters is not None else {"type": "object", "properties": {}}
    else:
        parameters, description = _custom_parameters(tool, where, description)
    spec: dict = {"name": flat}
    if description is not None:
        spec["description"] = description
    spec["parameters"] = parameters
    out.append({"type": "function", "function": spec})
    names.add(flat, ToolRef(kind, name, namespace))


def _custom_parameters(tool: dict, where: str, description: str | None) -> tuple[dict, str | None]:
    """A free-form tool as a function of one string; its grammar, if any, goes in the description,
    since the model can only follow what it is shown."""
    fmt = field(tool, "format", dict, f"{where}.format", default={})
    input_doc = "The tool's whole input, as free-form text."
    if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        input_doc = f"The tool's whole input, as text matching this {fmt.get('syntax', '')} grammar:\n{fmt['definition']}"
    parameters = {"type": "object", "properties": {"input": {"type": "string", "description": input_doc}},
                  "required": ["input"]}
    return parameters, description


def _tool_choice(choice: object, tools: list[dict] | None, names: ToolNames) -> str | dict:
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "allowed_tools":
            mode = choice.get("mode", "auto")
            return parse_tool_choice(mode if isinstance(mode, str) else None, tools)
        if kind in ("function", "custom") or (kind is None and "name" in choice):
            name = choice.get("name")
            namespace = choice.get("namespace")
            if isinstance(name, str) and isinstance(namespace, str):
                name = f"{namespace}.{name}"
            flat = names.flat(name) if isinstance(name, str) else None
            return parse_tool_choice({"name": flat or name}, tools)
        if isinstance(kind, str):
            warn_once(f"choice:{kind}", "tool_choice %r names a tool this server dropped; using 'auto'", kind)
            return "auto"
    if choice == "required" and not tools:
        return "auto"  # the only tools were dropped ones: nothing left to require
    return parse_tool_choice(choice, tools)


# -- input items → messages --

def to_messages(items: list, instructions: str | None, names: ToolNames, compacting=None) -> list[dict]:
    """Responses items → Hugging Face messages.

    System and developer messages before the first other item, with `instructions` first, become
    one system message: templates take the system prompt from the first message only, and codex
    sends several developer messages. Later ones stay where they are, as system messages; a family
    whose template refuses that joins them into the first (Family.system_first_only).
    """
    out = _Messages(instructions)
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            if out.message(item, where):
                continue  # a leading system message: more may follow
        elif kind in CALL_ITEMS:
            out.call(item, where, kind)
        elif kind in OUTPUT_ITEMS:
            out.output(item, where)
        elif kind == "reasoning":
            out.reasoning(reasoning_text(item))
        elif kind in ("compaction_trigger", "compaction", "compaction_summary") and compacting is not None:
            compacting.render(item, out)  # a summary asked for, or one given back: compaction.py
        else:
            text = _loose_text(item)
            if not text:
                log.warning("skipping input item %d of type %r: nothing here can replay it", i, kind)
                continue
            out.said("assistant" if item.get("role") == "assistant" else "user", text)
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

    def message(self, item: dict, where: str) -> bool:
        """True when it joined the leading system text."""
        role = field(item, "role", str, f"{where}.role", required=True)
        if role not in MESSAGE_ROLES:
            raise invalid(f"Invalid value for '{where}.role': '{role}'; expected one of "
                          f"{', '.join(MESSAGE_ROLES)}.", param=f"{where}.role")
        # Images go to the model from a user's message; elsewhere (a system prompt, the assistant's own
        # words) they are noted as text.
        text = content_text(item.get("content"), f"{where}.content", media=role == "user")
        if role in ("system", "developer") and self.leading:
            self.system.append(text)
            return True
        self.said("system" if role == "developer" else role, text)
        return False

    def call(self, item: dict, where: str, kind: str) -> None:
        call_id = field(item, "call_id", str, f"{where}.call_id", required=True)
        name = _name(item, where)
        namespace = field(item, "namespace", str, f"{where}.namespace")
        flat = f"{namespace}.{name}" if namespace else name
        if kind == "function_call":
            arguments = call_arguments(item.get("arguments", "{}"), f"{where}.arguments")
        else:
            arguments = {"input": field(item, "input", str, f"{where}.input", default="")}
        self.call_names[call_id] = flat
        self.assistant(CALLS).setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function", "function": {"name": flat, "arguments": arguments}})

    def output(self, item: dict, where: str) -> None:
        call_id = field(item, "call_id", str, f"{where}.call_id", required=True)
        message = {"role": "tool", "content": content_text(item.get("output"), f"{where}.output", media=True),
                   "tool_call_id": call_id}
        if call_id in self.call_names:
            message["name"] = self.call_names[call_id]
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


def content_text(content: object, param: str, media: bool = False) -> str | list[dict]:
    """A message's content, or a tool output: a string, or parts joined as the Chat adapter joins them.
    With `media` (a user's message, a tool's output), images are kept as parts; otherwise each becomes
    a note."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"Invalid type for '{param}': expected a string or an array of content parts, but got "
                      f"{describe(content)}.", param=param, code="invalid_type")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise invalid(f"Invalid type for '{param}[{j}]': expected an object.", param=f"{param}[{j}]",
                          code="invalid_type")
        kind = part.get("type")
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in MEDIA_PARTS:
            texts.append(media_part(part, f"{param}[{j}]") if media else media_note())
        else:
            raise invalid(f"Invalid value for '{param}[{j}].type': {kind!r}.", param=f"{param}[{j}].type")
    return joined(texts)


def reasoning_text(item: dict) -> str:
    """The reasoning's own text, else its summary; `encrypted_content` means nothing here."""
    for key, kinds in (("content", ("reasoning_text", "text")), ("summary", ("summary_text",))):
        parts = item.get(key)
        if isinstance(parts, list):
            texts = [p["text"] for p in parts if isinstance(p, dict) and p.get("type") in kinds
                     and isinstance(p.get("text"), str)]
            if texts:
                return "\n\n".join(texts)
    return ""


def _loose_text(item: dict) -> str:
    if isinstance(item.get("text"), str):
        return item["text"]
    content = item.get("content", item.get("output"))
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""
