"""An Anthropic Messages request body → a `GenerationRequest`, refusing bad input with a precise 400.

Fields this server has no use for (`metadata`, `service_tier`, `context_management`, `output_config`,
cache_control on blocks, `?beta=true`, the anthropic-beta and anthropic-version headers) are
accepted and ignored, as the OpenAI adapters ignore unknown fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...engine.request import GenerationRequest
from ..errors import invalid
from ..request_parts import MAX_STOP_LENGTH, MAX_STOPS, at_most, warn_once
from ..validation import field, in_range, is_a, tool_name
from .content import conversation

TOOL_CHOICES = ("auto", "any", "tool", "none")


@dataclass(slots=True)
class MessagesOptions:
    model: str
    stream: bool
    token_ids: bool = False  # vLLM's return_token_ids, which Messages lacks there: the prompt's and the answer's ids


def parse_messages(body: dict, *, counting: bool = False) -> tuple[GenerationRequest, MessagesOptions]:
    """`counting`: a count_tokens body, which has no max_tokens and no sampling settings."""
    model = field(body, "model", str, "model", required=True)
    conv = conversation(body)
    tools = _tools(at_most(field(body, "tools", list, "tools") or [], "tools", "tools"), conv.referenced)
    tool_choice, parallel = _tool_choice(field(body, "tool_choice", dict, "tool_choice"), tools)
    max_tokens = field(body, "max_tokens", int, "max_tokens", required=not counting)
    in_range(max_tokens, "max_tokens", 1)
    temperature = field(body, "temperature", float, "temperature")
    in_range(temperature, "temperature", 0, 1)  # Anthropic's range, not OpenAI's 0-2
    top_p = field(body, "top_p", float, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise invalid(f"Invalid value for 'top_p': {top_p} must be greater than 0 and at most 1.", param="top_p")
    top_k = field(body, "top_k", int, "top_k")
    in_range(top_k, "top_k", 0)
    field(body, "metadata", dict, "metadata")
    request = GenerationRequest(
        messages=conv.messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        enable_thinking=_thinking(field(body, "thinking", dict, "thinking"), max_tokens),
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        stop=_stop_sequences(body.get("stop_sequences")),
    )
    return request, MessagesOptions(model=model, stream=field(body, "stream", bool, "stream", default=False),
                                    token_ids=field(body, "return_token_ids", bool, "return_token_ids", default=False))


def _tools(tools: list | None, referenced: set[str]) -> list[dict] | None:
    """Client tools ({name, description, input_schema}) as the engine's OpenAI function tools.

    A tool with `defer_loading` is offered only once a tool_reference loaded it, as Anthropic does:
    Claude Code marks the tools its tool search finds that way. Anthropic's own server tools (a
    `type` such as web_search_20250305) run on Anthropic's servers: nothing here can run them, so
    they are dropped with a warning, not refused (a client sends them on every request)."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid(f"Invalid type for '{where}': expected an object.", param=where, code="invalid_type")
        kind = field(tool, "type", str, f"{where}.type")
        if kind not in (None, "custom"):
            warn_once("anthropic-server-tools", "dropped an Anthropic server tool (type %r): nothing here can run "
                      "it (said once)", kind[:64])
            continue
        name = field(tool, "name", str, f"{where}.name", required=True)
        if not name:
            raise invalid(f"'{where}.name' must not be empty.", param=f"{where}.name")
        tool_name(name, f"{where}.name")
        schema = field(tool, "input_schema", dict, f"{where}.input_schema", required=True)
        if field(tool, "defer_loading", bool, f"{where}.defer_loading", default=False) and name not in referenced:
            continue
        spec: dict = {"name": name}
        description = field(tool, "description", str, f"{where}.description")
        if description is not None:
            spec["description"] = description
        spec["parameters"] = schema
        out.append({"type": "function", "function": spec})
    return out or None


def _tool_choice(choice: dict | None, tools: list[dict] | None) -> tuple[str | dict, bool]:
    """{"type": auto | any | tool | none, "name", "disable_parallel_tool_use"} → (the engine's
    tool_choice, whether several calls may come in one answer)."""
    if choice is None:
        return "auto", True
    kind = field(choice, "type", str, "tool_choice.type", required=True)
    if kind not in TOOL_CHOICES:
        raise invalid(f"Invalid value for 'tool_choice.type': {kind!r}; expected one of {', '.join(TOOL_CHOICES)}.",
                      param="tool_choice.type")
    parallel = not field(choice, "disable_parallel_tool_use", bool, "tool_choice.disable_parallel_tool_use",
                         default=False)
    if kind in ("any", "tool") and not tools:
        raise invalid(f"'tool_choice' is {kind!r} but no tools were given.", param="tool_choice")
    if kind == "tool":
        name = tool_name(field(choice, "name", str, "tool_choice.name", required=True), "tool_choice.name")
        if name not in {t["function"]["name"] for t in tools or ()}:
            raise invalid(f"'tool_choice.name' names the tool {name!r}, which is not among the tools.",
                          param="tool_choice.name")
        return {"name": name}, parallel
    return {"any": "required"}.get(kind, kind), parallel


def _thinking(thinking: dict | None, max_tokens: int | None) -> bool | None:
    """`enabled` (with a budget) or `adaptive` → the family's thinking on; `disabled` → off; absent →
    the template's own default. The budget is checked as Anthropic checks it, not enforced: the
    answer's max_tokens bounds thinking and words together."""
    if thinking is None:
        return None
    kind = field(thinking, "type", str, "thinking.type", required=True)
    if kind == "disabled":
        return False
    if kind == "adaptive":
        return True
    if kind != "enabled":
        raise invalid(f"Invalid value for 'thinking.type': {kind!r}; expected 'enabled', 'adaptive' or 'disabled'.",
                      param="thinking.type")
    budget = field(thinking, "budget_tokens", int, "thinking.budget_tokens", required=True)
    in_range(budget, "thinking.budget_tokens", 1)
    if max_tokens is not None and budget >= max_tokens:
        raise invalid(f"'thinking.budget_tokens' ({budget}) must be less than 'max_tokens' ({max_tokens}).",
                      param="thinking.budget_tokens")
    return True


def _stop_sequences(stops: object) -> list[str]:
    if stops is None:
        return []
    if not isinstance(stops, list) or not all(is_a(s, str) for s in stops):
        raise invalid("Invalid type for 'stop_sequences': expected an array of strings.", param="stop_sequences",
                      code="invalid_type")
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_LENGTH for s in stops):
        raise invalid(f"'stop_sequences' takes at most {MAX_STOPS} strings of at most {MAX_STOP_LENGTH} characters "
                      "each.", param="stop_sequences")
    return stops
