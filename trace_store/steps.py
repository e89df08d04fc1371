"""A request's step summary: what the trace viewer shows of one step of an agent's loop, gathered
from its spans as they are stored, so that a session of hundreds of steps reads back as one small
JSON document per step instead of every prompt and token.

    {"trace_id", "start_ns", "end_ns", "endpoint", "model", "status", "http_status", "error",
     "finish_reason", "input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens",
     "ttft_ms", "queue_ms", "prefill_ms", "decode_ms", "tokens_per_second", "backend",
     "drafted", "accepted", "draft_method", "new_from", "new_messages", "output", "tool_calls", "tools",
     "continuity", "continuity_fork", "rollout_group", "fork_of", "route", "compaction", "compactions_expanded",
     "subagent"}

`new_messages` are the input messages new since the conversation's previous step, `output` the
model's reasoning and text, both in the GenAI conventions' role-and-parts shape, and absent when
the trace was recorded without content. `tools` counts the tool calls by outcome. `route` is the vLLM
routing's receipt: the server, the policy and its reason, the cached tokens predicted and those the
server then reported, the expected time to first token and its terms (backends/vllm/routing/cost.py) and the one it
took, and the runner-up. `compaction` marks a compaction step (how it was asked for, the summary's id, the
input items it replaces); `compactions_expanded`, a step whose input held compaction items, each read as
its summary. `subagent` names the agent of a subagent's or side request's step (id, parent, type, side).

Spans of a request end before its server span, so they are gathered first and the summary is
finished when the server span arrives.
"""

from __future__ import annotations

from collections import OrderedDict

from looptrace.common import attributes as attr
from looptrace.common.jsonio import loads

MAX_PENDING = 4096  # requests whose server span has not arrived yet (it may have been dropped)


def _ms(start: int | None, end: int | None) -> float | None:
    return round((end - start) / 1e6, 3) if start is not None and end is not None else None


def _json(attrs: dict, key: str):
    value = attrs.get(key)
    if not isinstance(value, str):
        return None
    try:
        return loads(value)
    except ValueError:
        return None


class StepGatherer:
    """Used by the store's writer thread only."""

    def __init__(self) -> None:
        self._pending: OrderedDict[str, dict] = OrderedDict()

    def _for(self, trace_id: str) -> dict:
        step = self._pending.get(trace_id)
        if step is None:
            step = self._pending[trace_id] = {"tool_calls": []}
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
        return step

    def add(self, trace_id: str, name: str, attrs: dict, start_ns: int, end_ns: int) -> None:
        """A span below the server span."""
        step = self._for(trace_id)
        if name == attr.SPAN_PREFILL:
            step["prefill"] = (start_ns, end_ns, attrs.get(attr.PREFILL_SECONDS), attrs.get(attr.PREFILL_CACHED_TOKENS))
        elif name == attr.SPAN_RENDER:
            step["continuity"] = attrs.get(attr.PROMPT_CONTINUITY)
            step["continuity_fork"] = attrs.get(attr.PROMPT_CONTINUITY_FORK)
        elif name == attr.SPAN_DECODE:
            step["decode"] = attrs
        elif name.startswith(attr.SPAN_EXECUTE_TOOL):
            call = {"outcome": attrs.get(attr.TOOL_OUTCOME), "name": attrs.get(attr.GEN_AI_TOOL_NAME),
                    "id": attrs.get(attr.GEN_AI_TOOL_CALL_ID), "index": attrs.get(attr.TOOL_INDEX),
                    "arguments": attrs.get(attr.GEN_AI_TOOL_CALL_ARGUMENTS), "raw": attrs.get(attr.TOOL_RAW)}
            step["tool_calls"].append({k: v for k, v in call.items() if v is not None})

    def finish(self, trace_id: str, attrs: dict, start_ns: int, end_ns: int, status: str) -> dict:
        """The server span arrived: the step's summary."""
        gathered = self._pending.pop(trace_id, None) or {"tool_calls": []}
        prefill = gathered.get("prefill")
        decode = gathered.get("decode") or {}
        reasons = attrs.get(attr.GEN_AI_RESPONSE_FINISH_REASONS) or ()
        calls = sorted(gathered["tool_calls"], key=lambda c: c.get("index", 1 << 30))
        tools: dict[str, int] = {}
        for call in calls:
            tools[call.get("outcome", "unparsed")] = tools.get(call.get("outcome", "unparsed"), 0) + 1
        step = {
            "trace_id": trace_id, "start_ns": start_ns, "end_ns": end_ns,
            "endpoint": attrs.get(attr.ENDPOINT), "model": attrs.get(attr.GEN_AI_REQUEST_MODEL), "status": status,
            "http_status": attrs.get(attr.HTTP_RESPONSE_STATUS_CODE), "error": attrs.get(attr.ERROR_TYPE),
            "finish_reason": reasons[0] if reasons else None,
            "input_tokens": attrs.get(attr.GEN_AI_USAGE_INPUT_TOKENS),
            "output_tokens": attrs.get(attr.GEN_AI_USAGE_OUTPUT_TOKENS),
            "reasoning_tokens": attrs.get(attr.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS),
            "cached_tokens": attrs.get(attr.USAGE_CACHED_TOKENS),
            "ttft_ms": _ms(start_ns, prefill[1]) if prefill else None,
            # The prefill span runs from submission to the first token; the backend's own prefill
            # time is part of it, and the rest is waiting for the model.
            "queue_ms": (max(0.0, round(_ms(prefill[0], prefill[1]) - prefill[2] * 1e3, 3))
                         if prefill and prefill[2] is not None else None),
            "prefill_ms": round(prefill[2] * 1e3, 3) if prefill and prefill[2] is not None else None,
            "decode_ms": round(decode[attr.DECODE_SECONDS] * 1e3, 3) if attr.DECODE_SECONDS in decode else None,
            "tokens_per_second": decode.get(attr.DECODE_TOKENS_PER_SECOND),
            "backend": decode.get(attr.BACKEND),
            "drafted": decode.get(attr.SPEC_DRAFTED_TOKENS),
            "accepted": decode.get(attr.SPEC_ACCEPTED_TOKENS),
            "draft_method": decode.get(attr.SPEC_METHOD),
            "new_from": attrs.get(attr.INPUT_NEW_FROM),
            "new_messages": _json(attrs, attr.INPUT_NEW_MESSAGES),
            "output": _json(attrs, attr.GEN_AI_OUTPUT_MESSAGES),
            "tool_calls": calls,
            "tools": tools,
            "continuity": gathered.get("continuity"), "continuity_fork": gathered.get("continuity_fork"),
            "rollout_group": attrs.get(attr.ROLLOUT_GROUP), "grouped_by": attrs.get(attr.SESSION_GROUPED_BY),
            "fork_of": ({"trace_id": attrs[attr.FORK_TRACE_ID], "index": attrs.get(attr.FORK_INDEX)}
                        if attr.FORK_TRACE_ID in attrs else None),
            "route": _route(decode),
            "compaction": _compaction(attrs),
            "compactions_expanded": attrs.get(attr.COMPACTION_EXPANDED),
            "subagent": _subagent(attrs),
        }
        return {k: v for k, v in step.items() if v is not None}


def _subagent(attrs: dict) -> dict | None:
    """The agent a subagent's (or a side request's) step was sent by, as its harness named it; None for
    the main agent's (agent_tree.py places each in the session's tree)."""
    if attr.AGENT_ID not in attrs:
        return None
    found = {"id": attrs[attr.AGENT_ID], "parent": attrs.get(attr.AGENT_PARENT_ID), "type": attrs.get(attr.AGENT_TYPE),
             "side": attrs.get(attr.AGENT_SIDE)}
    return {k: v for k, v in found.items() if v is not None}


def _compaction(attrs: dict) -> dict | None:
    """A compaction step's how, summary id (none for a client's own) and items replaced; None for another."""
    if attr.COMPACTION not in attrs:
        return None
    found = {"how": attrs[attr.COMPACTION], "id": attrs.get(attr.COMPACTION_ID),
             "replaced_items": attrs.get(attr.COMPACTION_REPLACED_ITEMS)}
    return {k: v for k, v in found.items() if v is not None}


def _route(decode: dict) -> dict | None:
    """The routing receipt the decode span carries (a vLLM backend's), under the step's keys for it
    (common/attributes.py's ROUTE_RECEIPT), or None."""
    if attr.ROUTE_POLICY not in decode:
        return None
    route = {"server": f"{decode.get(attr.SERVER_ADDRESS)}:{decode.get(attr.SERVER_PORT)}"}
    route.update({key: decode[name] for _, name, key in attr.ROUTE_RECEIPT if key is not None and name in decode})
    return route


def searchable_text(step: dict) -> str:
    """What a text search of the sessions finds a step by: its new messages and the model's output."""
    texts: list[str] = []
    for message in (step.get("new_messages") or []) + (step.get("output") or []):
        for part in message.get("parts", ()):
            for key in ("content", "name", "arguments", "response"):
                value = part.get(key)
                if isinstance(value, str):
                    texts.append(value)
                elif value is not None and key in ("arguments", "response"):
                    texts.append(str(value))
    return "\n".join(texts)
