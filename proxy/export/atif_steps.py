"""One agent's requests as ATIF steps (atif.py makes the trajectory around them): per request, the
messages new since the agent's previous request (system and user steps; tool results as the
observations of the step that made the call), then the model's answer as an agent step with its
token ids, logprobs, token counts and timings, as the store holds them.

What is new is found by comparing each request's messages with the agent's previous request's,
never from the conversation's own record (`looptrace.input.new_messages`): a subagent's requests
share its parent's conversation, so that record may be against the other agent's request. A
request that continues the previous one starts with its messages; the first assistant message after
them is the harness sending the model's last answer back (already its agent step), and is left out.
A request that does not (a harness that compacted or edited its history), and a first request that
carries history, repeat earlier turns: their assistant messages, and what comes before the last of
them, are steps with `is_copied_context` (ATIF: "MUST be filtered out of SFT data").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps, loads, loads_strict
from looptrace.trace_store.recorded_sessions import Recorded

TIMINGS = ("queue_ms", "ttft_ms", "prefill_ms", "decode_ms", "tokens_per_second")


@dataclass(slots=True)
class Turn:
    """One request of the session: its step summary (the viewer's) and the step read whole."""

    summary: dict
    recorded: Recorded

    @property
    def attributes(self) -> dict:
        return self.recorded.request

    def json(self, name: str) -> list:
        """A JSON list attribute (messages, parts, tools); none where absent (--no-trace-content) or unreadable."""
        value = self.attributes.get(name)
        try:
            found = loads(value) if isinstance(value, str) else []
        except ValueError:
            return []
        return found if isinstance(found, list) else []


@dataclass
class StepWriter:
    """The steps of one agent's trajectory, written request by request."""

    steps: list[dict] = field(default_factory=list)
    agent_steps: list[tuple[int, dict]] = field(default_factory=list)  # (start_ns, step) of each model call
    result_at: dict[str, int] = field(default_factory=dict)  # a call id → when the request with its result began
    _calls: dict[str, dict] = field(default_factory=dict)  # a call id → the step that made it
    _held: list[dict] | None = None  # the previous request's messages
    _system: list | None = None

    def add(self, turn: Turn) -> None:
        system = turn.json(attr.GEN_AI_SYSTEM_INSTRUCTIONS)
        if system and system != self._system:
            self._step("system", system, copied=False)
        self._system = system or self._system
        messages = turn.json(attr.GEN_AI_INPUT_MESSAGES)
        self._read(messages, turn.summary["start_ns"])
        self._held = messages
        self._answer(turn)

    def _read(self, messages: list[dict], start_ns: int) -> None:
        """The messages new since the previous request, as steps and observations."""
        held = self._held or []
        kept = 0
        while kept < min(len(held), len(messages)) and held[kept] == messages[kept]:
            kept += 1
        continues = self._held is not None and kept == len(held)
        new = messages[kept:]
        last_answer = max((i for i, m in enumerate(new) if m.get("role") == "assistant"), default=-1)
        for i, message in enumerate(new):
            if message.get("role") == "assistant":
                if not (continues and i == 0 and self.agent_steps):  # else: the last answer sent back
                    self._copied_answer(message)
                continue
            for part in message.get("parts", []):
                if part.get("type") == "tool_call_response":
                    self._result(part, start_ns)
            if any(p.get("type") != "tool_call_response" for p in message.get("parts", [])):
                self._step("system" if message.get("role") == "system" else "user", message.get("parts", []),
                           copied=i < last_answer)

    def _step(self, source: str, parts: list, copied: bool, **fields) -> dict:
        step = {"step_id": len(self.steps) + 1, "source": source, **{k: v for k, v in fields.items() if v is not None}}
        step["message"], left_out = content(parts)
        if copied:
            step["is_copied_context"] = True
        if left_out:
            step["extra"] = {**step.get("extra", {}), "parts_left_out": left_out}
        self.steps.append(step)
        return step

    def _copied_answer(self, message: dict) -> None:
        parts = message.get("parts", [])
        step = self._step("agent", [p for p in parts if p.get("type") == "text"], copied=True)
        _set_reasoning(step, parts)
        self._calls_of(step, [p for p in parts if p.get("type") == "tool_call"], {})

    def _answer(self, turn: Turn) -> None:
        """The model's answer: an agent step with its numbers."""
        summary, recorded = turn.summary, turn.recorded
        parts = [p for m in turn.json(attr.GEN_AI_OUTPUT_MESSAGES) for p in m.get("parts", [])]
        step = self._step("agent", [p for p in parts if p.get("type") == "text"], copied=False,
                          timestamp=iso(summary["start_ns"]),
                          model_name=recorded.request.get(attr.GEN_AI_RESPONSE_MODEL) or recorded.model)
        _set_reasoning(step, parts)
        outcomes = {c.get("id"): c for c in summary.get("tool_calls", [])}
        self._calls_of(step, [p for p in parts if p.get("type") == "tool_call"], outcomes)
        step["metrics"] = metrics(summary, recorded)
        step["extra"] = {**step.get("extra", {}), **step_extra(summary, recorded)}
        self.agent_steps.append((summary["start_ns"], step))

    def _calls_of(self, step: dict, calls: list[dict], outcomes: dict) -> None:
        found = []
        for n, call in enumerate(calls):
            call_id = call.get("id") or f"call_{step['step_id']}_{n}"  # ATIF requires one; a harness may send none
            arguments, raw = _arguments(call.get("arguments"))
            extra = {k: v for k, v in outcomes.get(call.get("id"), {}).items() if k in ("outcome", "raw")}
            if raw is not None:
                extra["arguments_text"] = raw
            found.append({"tool_call_id": call_id, "function_name": call.get("name") or "", "arguments": arguments,
                          **({"extra": extra} if extra else {})})
            self._calls[call_id] = step
        if found:
            step["tool_calls"] = found

    def _result(self, part: dict, start_ns: int) -> None:
        """A tool's result: an observation of the step whose call it answers (of the last agent step, with
        no source_call_id, when the call is not in this trajectory)."""
        call_id = part.get("id")
        response = part.get("response")
        result = {"source_call_id": call_id, "content": response if isinstance(response, str) else dumps(response)}
        step = self._calls.get(call_id)
        if step is None:
            result = {"content": result["content"], "extra": {"tool_call_id": call_id}}
            step = self.agent_steps[-1][1] if self.agent_steps else self._step("system", [], copied=False)
        else:
            self.result_at.setdefault(call_id, start_ns)
        step.setdefault("observation", {"results": []})["results"].append(result)


def content(parts: list) -> tuple[str | list[dict], list[str]]:
    """A message's text as ATIF has it (one text part: a string; several: text content parts), and the
    kinds of the parts it cannot hold (an image or audio whose bytes a trace does not keep)."""
    texts = [p.get("content") or "" for p in parts if p.get("type") == "text"]
    left_out = [p.get("type", "?") for p in parts if p.get("type") not in ("text", "reasoning", "tool_call",
                                                                            "tool_call_response")]
    if len(texts) == 1:
        return texts[0], left_out
    return [{"type": "text", "text": t} for t in texts] if texts else "", left_out


def _set_reasoning(step: dict, parts: list[dict]) -> None:
    reasoning = "".join(p.get("content") or "" for p in parts if p.get("type") == "reasoning")
    if reasoning:
        step["reasoning_content"] = reasoning


def _arguments(value: object) -> tuple[dict, str | None]:
    """A call's arguments as the JSON object ATIF asks for, and the text as written where it is not one."""
    if isinstance(value, dict):
        return value, None
    if isinstance(value, str):
        try:
            parsed = loads_strict(value)  # NaN or 1e400 would make the line one strict readers refuse
        except ValueError:
            parsed = None
        return (parsed, None) if isinstance(parsed, dict) else ({}, value)
    return {}, (dumps(value) if value is not None else None)


def metrics(summary: dict, recorded: Recorded) -> dict:
    """Token counts, and the ids and logprobs token for token where the store kept them."""
    found = {"prompt_tokens": summary.get("input_tokens"), "completion_tokens": summary.get("output_tokens"),
             "cached_tokens": summary.get("cached_tokens")}
    if not recorded.skipped:
        found["prompt_token_ids"] = recorded.prompt_ids
        found["completion_token_ids"] = [t["id"] for t in recorded.tokens]
        logprobs = [t.get("logprob") for t in recorded.tokens]
        if all(isinstance(p, (int, float)) for p in logprobs):  # ATIF's list is of numbers: all of them or none
            found["logprobs"] = logprobs
    extra = {"reasoning_tokens": summary.get("reasoning_tokens"), "forced_tokens": recorded.forced or None}
    found["extra"] = {k: v for k, v in extra.items() if v is not None}
    return {k: v for k, v in found.items() if v not in (None, {})}


def step_extra(summary: dict, recorded: Recorded) -> dict:
    timings = {k: summary[k] for k in TIMINGS if summary.get(k) is not None}
    if summary.get("end_ns") is not None:
        timings["duration_ms"] = (summary["end_ns"] - summary["start_ns"]) / 1e6
    extra = {"trace_id": summary["trace_id"], "endpoint": summary.get("endpoint"),
             "finish_reason": summary.get("finish_reason"), "backend": summary.get("backend"), "timings": timings,
             "weight_version": recorded.request.get(attr.WEIGHT_VERSION),
             "continuity": recorded.render.get(attr.PROMPT_CONTINUITY),
             "not_token_exact": recorded.skipped or ("credentials in it were redacted: its stored ids are not what "
                                                     "the model read" if recorded.request.get(attr.REDACTED) else None),
             "redacted": recorded.request.get(attr.REDACTED)}
    if summary.get("drafted"):
        extra["speculative"] = {"drafted": summary["drafted"], "accepted": summary.get("accepted")}
    return {k: v for k, v in extra.items() if v is not None}


def iso(ns: int) -> str:
    """A time as ISO 8601 in UTC, to the microsecond."""
    moment = datetime.fromtimestamp(ns // 10**9, tz=timezone.utc) + timedelta(microseconds=ns % 10**9 // 1000)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")
