"""The request fields a response object repeats, each with the value in effect.

The Open Responses specification (openresponses/openresponses, `public/openapi/openapi.json`,
`ResponseResource`) requires every one of them on every response object and every
`response.created` / `in_progress` / `completed` snapshot, where the openai SDK's types leave most
optional: a strict client of the specification refuses a response that lacks one. Each says what
this server did, not what was asked: `temperature` and `top_p` are the sampling settings the
generation used (the family's defaults where the request named none), `top_logprobs` is 0 (Responses
output carries no logprobs here), `max_tool_calls` is null (no limit is applied), `service_tier` is
the tier asked for ("auto" served as "default": service_tiers.py), and each echoed function tool
says `strict: false` (arguments are checked after the call, never constrained while it is written).
"""

from __future__ import annotations

from looptrace.backends.base import SamplingParams

from ..service_tiers import served
from .protocol import FunctionTool, ResponsesRequest, ToolChoice


def echoed(body: ResponsesRequest, **known) -> dict:
    """The response object's echo of the request: `known` holds what the parser already read."""
    choice = body.tool_choice
    return {
        **known,
        "previous_response_id": body.previous_response_id,
        "tool_choice": choice.model_dump(exclude_unset=True) if isinstance(choice, ToolChoice) else choice or "auto",
        "tools": echoed_tools(body.tools or ()),
        "metadata": body.metadata or {}, "prompt_cache_key": body.prompt_cache_key,
        "presence_penalty": body.presence_penalty or 0.0, "frequency_penalty": body.frequency_penalty or 0.0,
        "top_logprobs": 0, "max_tool_calls": None, "background": False, "service_tier": served(body.service_tier),
        "safety_identifier": body.safety_identifier,
    }


def echoed_tools(tools) -> list:
    """The request's tools as given, each function tool with the `strict` in effect and a
    `description` (the specification requires both, null where there is none)."""
    out = []
    for tool in tools:
        given = tool.model_dump(exclude_unset=True)
        if isinstance(tool, FunctionTool):
            given = {"description": None, "parameters": None, **given, "strict": False}
        out.append(given)
    return out


def with_sampling(echo: dict, sampling: SamplingParams) -> None:
    """The settings the generation decodes with, once it is prepared (the family's defaults filled in)."""
    echo["temperature"] = sampling.temperature
    echo["top_p"] = sampling.top_p
    echo["presence_penalty"] = sampling.presence_penalty
    echo["frequency_penalty"] = sampling.frequency_penalty
