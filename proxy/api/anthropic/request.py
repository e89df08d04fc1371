"""An Anthropic Messages request body → a `GenerationRequest`: parsed once into protocol.py's models
(a 400 naming the place of anything wrong), then converted.

Fields this server has no use for (`metadata`, `service_tier`, `output_config.effort` — no family
here has an effort knob —, cache_control on blocks, `?beta=true`, the anthropic-beta and
anthropic-version headers, whatever betas they list) are accepted and ignored, as the OpenAI
adapters ignore unknown fields. `context_management.edits` are applied (context_edits.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...engine.request import GenerationRequest
from ..errors import invalid
from ..protocol import parse
from ..request_parts import warn_once
from ..validation import tool_name
from .content import conversation
from .protocol import ContextManagement, CountTokensRequest, CustomTool, MessagesRequest, Thinking, Tool, ToolChoice


@dataclass(slots=True)
class MessagesOptions:
    model: str
    stream: bool
    token_ids: bool = False  # vLLM's return_token_ids, which Messages lacks there: the prompt's and the answer's ids
    thinking_shown: bool = True  # False: `thinking.display` "omitted", thinking blocks answered without their text
    context_management: ContextManagement | None = None  # the edits to apply (context_edits.py)


def parse_messages(body: dict, *, counting: bool = False) -> tuple[GenerationRequest, MessagesOptions]:
    """`counting`: a count_tokens body, which has no max_tokens."""
    request = parse(CountTokensRequest if counting else MessagesRequest, body)
    conv = conversation(request.system, request.messages)
    tools = _tools(request.tools, conv.referenced)
    tool_choice, parallel = _tool_choice(request.tool_choice, tools)
    generation = GenerationRequest(
        messages=conv.messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        enable_thinking=_thinking(request.thinking, request.max_tokens),
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        stop=list(request.stop_sequences or ()),
    )
    # `display: "omitted"` (Claude Code 2.1.33x sends it) is not honoured: Anthropic restores a block sent
    # back empty from its encrypted signature, and ours is a digest, so an omitted thought would be lost to
    # the model's next turn in its own tool loop. The text is sent; MessageStream can leave it out.
    shown = True
    return generation, MessagesOptions(model=request.model, stream=bool(request.stream),
                                       token_ids=bool(request.return_token_ids), thinking_shown=shown,
                                       context_management=request.context_management)


def _tools(tools: list[Tool] | None, referenced: set[str]) -> list[dict] | None:
    """Client tools ({name, description, input_schema}) as the engine's OpenAI function tools.

    A tool with `defer_loading` is offered only once a tool_reference loaded it, as Anthropic does:
    Claude Code marks the tools its tool search finds that way. Anthropic's own server tools (a
    `type` such as web_search_20250305) run on Anthropic's servers: nothing here can run them, so
    they are dropped with a warning, not refused (a client sends them on every request)."""
    if not tools:
        return None
    out = []
    for tool in tools:
        if type(tool) is not CustomTool:
            warn_once("anthropic-server-tools", "dropped an Anthropic server tool (type %r): nothing here can run "
                      "it (said once)", tool.type[:64])
            continue
        if tool.defer_loading and tool.name not in referenced:
            continue
        spec: dict = {"name": tool.name}
        if tool.description is not None:
            spec["description"] = tool.description
        spec["parameters"] = tool.input_schema
        out.append({"type": "function", "function": spec})
    return out or None


def _tool_choice(choice: ToolChoice | None, tools: list[dict] | None) -> tuple[str | dict, bool]:
    """{"type": auto | any | tool | none, "name", "disable_parallel_tool_use"} → (the engine's
    tool_choice, whether several calls may come in one answer)."""
    if choice is None:
        return "auto", True
    kind, parallel = choice.type, not choice.disable_parallel_tool_use
    if kind in ("any", "tool") and not tools:
        raise invalid(f"'tool_choice' is {kind!r} but no tools were given.", param="tool_choice")
    if kind == "tool":
        if choice.name is None:
            raise invalid("Missing required parameter: 'tool_choice.name'.", param="tool_choice.name",
                          code="missing_required_parameter")
        name = tool_name(choice.name, "tool_choice.name")
        if name not in {t["function"]["name"] for t in tools or ()}:
            raise invalid(f"'tool_choice.name' names the tool {name!r}, which is not among the tools.",
                          param="tool_choice.name")
        return {"name": name}, parallel
    return {"any": "required"}.get(kind, kind), parallel


def _thinking(thinking: Thinking | None, max_tokens: int | None) -> bool | None:
    """`enabled` (with a budget) or `adaptive` → the family's thinking on; `disabled` → off; absent →
    the template's own default. The budget is checked as Anthropic checks it, not enforced: the
    answer's max_tokens bounds thinking and words together."""
    if thinking is None:
        return None
    if thinking.type != "enabled":
        return thinking.type == "adaptive"
    budget = thinking.budget_tokens
    if budget is None:
        raise invalid("Missing required parameter: 'thinking.budget_tokens'.", param="thinking.budget_tokens",
                      code="missing_required_parameter")
    if max_tokens is not None and budget >= max_tokens:
        raise invalid(f"'thinking.budget_tokens' ({budget}) must be less than 'max_tokens' ({max_tokens}).",
                      param="thinking.budget_tokens")
    return True
