"""A recorded session as a replay reads it: each step's prompt ids, the tokens the model chose with
their logprobs, its tool calls, its tools and sampling settings, straight from the stored spans.

The store is opened through one function (`open_reader`, `open_writer`): location.py's
openers, which take what `--trace-db` takes (a SQLite file or a PostgreSQL URL).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from looptrace.common import attributes as attr
from looptrace.common.jsonio import loads

from .location import open_queries, open_store, unreadable
from .records import request_span

# A replay adds to a store and never retires what is there: retiring old traces is the server's
# business, with its own --trace-retention-days and --trace-max-mb.
KEEP_SECONDS = 100 * 365 * 86400.0
KEEP_BYTES = 1 << 62


class ReplayError(Exception):
    """What stops a replay or an export before it starts, said to the person who ran it."""


def open_reader(spec: str):
    """The store's read side, from a path or a URL as --trace-db takes it, once it was found readable
    (a missing file, a wrong password or a PostgreSQL that is down: said at once, in a line)."""
    try:
        store = open_queries(spec)
        why = unreadable(spec) if store is not None else None
    except ValueError as exc:
        raise ReplayError(str(exc).replace("--trace-db", "--store")) from exc
    if store is None:
        raise ReplayError("--store off: there is no store to read")
    if why:
        raise ReplayError(f"--store: {why}")
    return store


def open_writer(spec: str):
    """The same store, for writing a replay's spans into it (SpanExporter)."""
    return open_store(spec, retention_seconds=KEEP_SECONDS, max_bytes=KEEP_BYTES)


@dataclass(slots=True)
class Recorded:
    """One step of a recorded session, as it ran."""

    step: int  # its place in the session, from 1
    trace_id: str
    span_id: str  # its request span's, for the replay's link
    model: str | None
    skipped: str = ""  # why it cannot be replayed ("" when it can)
    prompt_ids: list[int] = field(default_factory=list)  # as rendered, a forced opening included
    forced: int = 0  # how many of prompt_ids' last tokens are a forced opening the answer starts with
    thinking: bool = False
    tokens: list[dict] = field(default_factory=list)  # the decode span's tokens (id, piece, logprob, top_ids, …)
    calls: list[dict] = field(default_factory=list)  # its tool calls, in order: name, arguments, outcome
    tools: list[dict] | None = None  # the tools offered, as OpenAI function tools
    sampling: dict = field(default_factory=dict)  # temperature, top_p, top_k, seed, max_tokens as used
    finish_reason: str | None = None
    render: dict = field(default_factory=dict)  # the render span's attributes, as stored
    request: dict = field(default_factory=dict)  # the request span's attributes, as stored


def session_steps(store, key: str) -> list[Recorded]:
    """Every step of a session, oldest first; a step that cannot be replayed says why in `skipped`."""
    if not key:
        raise ReplayError("--session is empty: give the session's key, as the viewer shows it")
    session = store.session(key)
    if session is None:
        raise ReplayError(f"no session {key!r} in the store (the key is the conversation id the viewer shows, or "
                          "trace:TRACE_ID for a request that carried none)")
    return [read_step(store, n, step["trace_id"]) for n, step in enumerate(session["steps"], 1)]


def read_step(store, step: int, trace_id: str) -> Recorded:
    trace = store.get_trace(trace_id)
    root = request_span(trace["spans"]) if trace else None
    if root is None:
        return Recorded(step, trace_id, "", None, skipped="its request span is not in the store")
    attrs = root["attributes"]
    recorded = Recorded(step, trace_id, root["span_id"], attrs.get(attr.GEN_AI_REQUEST_MODEL), request=attrs)
    spans = {s["name"]: s for s in trace["spans"]}
    render = spans.get(attr.SPAN_RENDER, {}).get("attributes", {})
    decode = spans.get(attr.SPAN_DECODE, {})
    recorded.render, recorded.tokens = render, decode.get("tokens", [])
    recorded.skipped = _why_not(trace, render, recorded.tokens)
    if recorded.skipped:
        return recorded
    recorded.prompt_ids = render[attr.PROMPT_IDS]
    recorded.forced = render.get(attr.PROMPT_FORCED_TOKENS, 0)
    recorded.thinking = bool(render.get(attr.PROMPT_THINKING))
    recorded.calls = tool_calls(trace["spans"])
    definitions = attrs.get(attr.GEN_AI_TOOL_DEFINITIONS)
    recorded.tools = [{"type": "function", "function": {k: d[k] for k in ("name", "description", "parameters")
                                                         if d.get(k) is not None}}
                      for d in loads(definitions)] if definitions else None
    recorded.sampling = {key: attrs.get(name) for key, name in (
        ("temperature", attr.GEN_AI_REQUEST_TEMPERATURE), ("top_p", attr.GEN_AI_REQUEST_TOP_P),
        ("top_k", attr.GEN_AI_REQUEST_TOP_K), ("seed", attr.GEN_AI_REQUEST_SEED),
        ("max_tokens", attr.GEN_AI_REQUEST_MAX_TOKENS))}
    reasons = attrs.get(attr.GEN_AI_RESPONSE_FINISH_REASONS) or ()
    recorded.finish_reason = reasons[0] if reasons else None
    return recorded


def _why_not(trace: dict, render: dict, tokens: list[dict]) -> str:
    if not trace.get("complete", True):
        return "the store does not hold all of its spans"
    if render.get(attr.PROMPT_MEDIA):
        return "its prompt held images or audio, whose bytes a trace does not keep"
    if render.get(attr.PROMPT_IDS) is None or any("id" not in t for t in tokens):
        return "it was recorded without content (--no-trace-content): its token ids were not kept"
    if not tokens:
        return "it generated no tokens"
    return ""


def tool_calls(spans: list[dict]) -> list[dict]:
    """A trace's tool calls in the order the model made them: name, arguments (JSON text), outcome, raw."""
    calls = []
    for span in spans:
        if not span["name"].startswith(attr.SPAN_EXECUTE_TOOL):
            continue
        a = span["attributes"]
        calls.append({"index": a.get(attr.TOOL_INDEX), "name": a.get(attr.GEN_AI_TOOL_NAME),
                      "id": a.get(attr.GEN_AI_TOOL_CALL_ID), "arguments": a.get(attr.GEN_AI_TOOL_CALL_ARGUMENTS),
                      "outcome": a.get(attr.TOOL_OUTCOME), "raw": a.get(attr.TOOL_RAW),
                      "start": span["start_time_unix_nano"]})
    calls.sort(key=lambda c: (c["index"] if c["index"] is not None else 1 << 30, c["start"]))
    return [{k: v for k, v in c.items() if k != "start" and v is not None} for c in calls]
