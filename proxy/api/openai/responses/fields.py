"""The request fields a response object repeats, each with the value in effect.

The Open Responses specification (openresponses/openresponses, `public/openapi/openapi.json`,
`ResponseResource`) requires every one of them on every response object and every
`response.created` / `in_progress` / `completed` snapshot, where the openai SDK's types leave most
optional: a strict client of the specification refuses a response that lacks one. Each says what
this server did, not what was asked: `temperature` and `top_p` are the sampling settings the
generation used (the family's defaults where the request named none), `top_logprobs` is 0 (Responses
output carries no logprobs here), `max_tool_calls` is null (no limit is applied), `service_tier` is
"default", and each echoed function tool says `strict: false` (arguments are checked after the call,
never constrained while it is written).
"""

from __future__ import annotations

from looptrace.backends.base import SamplingParams

from ...errors import invalid
from ...validation import field, in_range

SERVICE_TIERS = ("auto", "default", "flex", "priority")


def penalties(body: dict) -> tuple[float, float]:
    """`presence_penalty` and `frequency_penalty`, −2 to 2 (OpenAI's formula, as Chat Completions applies them)."""
    values = []
    for name in ("presence_penalty", "frequency_penalty"):
        value = field(body, name, float, name, default=0.0)
        in_range(value, name, -2, 2)
        values.append(value)
    return values[0], values[1]


def checked_transport_fields(body: dict) -> None:
    """Fields accepted and typed; `background: true` is refused: nothing here runs a response after its
    request ends, and a client told it did would poll for ever."""
    if field(body, "background", bool, "background", default=False):
        raise invalid("Background mode is not supported by this server: send the request without 'background' "
                      "(or stream it).", param="background", code="unsupported_parameter")
    tier = field(body, "service_tier", str, "service_tier")
    if tier is not None and tier not in SERVICE_TIERS:
        raise invalid(f"Invalid value for 'service_tier': {tier!r}; expected one of {', '.join(SERVICE_TIERS)}.",
                      param="service_tier")
    top_logprobs = field(body, "top_logprobs", int, "top_logprobs")
    in_range(top_logprobs, "top_logprobs", 0, 20)
    max_tool_calls = field(body, "max_tool_calls", int, "max_tool_calls")
    in_range(max_tool_calls, "max_tool_calls", 1)
    identifier = field(body, "safety_identifier", str, "safety_identifier")
    if identifier is not None and len(identifier) > 64:
        raise invalid("'safety_identifier' is longer than 64 characters.", param="safety_identifier")


def echoed(body: dict, **known) -> dict:
    """The response object's echo of the request: `known` holds what the parser already read."""
    checked_transport_fields(body)
    presence, frequency = penalties(body)
    return {
        **known,
        "previous_response_id": body.get("previous_response_id"),
        "tool_choice": body.get("tool_choice", "auto"), "tools": echoed_tools(body.get("tools") or []),
        "metadata": body.get("metadata") or {}, "prompt_cache_key": body.get("prompt_cache_key"),
        "presence_penalty": presence, "frequency_penalty": frequency, "top_logprobs": 0, "max_tool_calls": None,
        "background": False, "service_tier": "default", "safety_identifier": body.get("safety_identifier"),
    }


def echoed_tools(tools: list) -> list:
    """The request's tools as given, each function tool with the `strict` in effect and a
    `description` (the specification requires both, null where there is none)."""
    out = []
    for tool in tools:
        if isinstance(tool, dict) and tool.get("type", "function") == "function":
            tool = {"description": None, "parameters": None, **tool, "strict": False}
        out.append(tool)
    return out


def with_sampling(echo: dict, sampling: SamplingParams) -> None:
    """The settings the generation decodes with, once it is prepared (the family's defaults filled in)."""
    echo["temperature"] = sampling.temperature
    echo["top_p"] = sampling.top_p
    echo["presence_penalty"] = sampling.presence_penalty
    echo["frequency_penalty"] = sampling.frequency_penalty
