"""What watches a generation (spans, metrics): the hooks `Generation` calls, in order, and what each sees.

An observer only watches. The events and the generation it is shown are facts it never writes to;
the one thing a tracer adds to a request, the trace context the backend forwards upstream, it
returns from `submitted`, and the engine sets it on the request. A generation has any number of
observers (a tuple, called in order), each with its own job: proxy/observe/request_spans.py records
the spans, request_metrics.py the metrics.

Threads: `rendered` runs on the thread that renders the prompt (a worker thread, or the event loop
for a short prompt); every other hook runs on the event loop, one request's hooks one at a time.
The base class ignores everything, so an observer defines only the hooks it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from looptrace.backends.base import DecodeRequest
    from looptrace.backends.events import PrefillEvent, TokenEvent, UpstreamEvent
    from looptrace.families.deltas import ToolCallDelta, UnparsedCallDelta

# The generation each hook is shown is generation.py's Generation, which calls these hooks: typed here
# as `Generation = Any`, not imported, so that the engine's modules import one way (generation.py →
# observer.py) and no circle forms, even one a type checker alone would follow.
Generation = Any


class Observer:
    def rendered(self, generation: Generation, started_ns: int, ended_ns: int, content: bool = True) -> None:
        """The prompt is rendered and tokenized (`generation.rendered`, `.prompt_ids`, `.media_parts`;
        `.previous`, the conversation's last turn as the engine remembers it: memory.py), between those
        wall-clock times; called before a prompt too long for the context is refused.
        `content` is False for such a prompt: its text and ids are not to be kept."""

    def submitted(self, generation: Generation, decode: DecodeRequest) -> dict[str, str]:
        """The request goes to the backend now, with its sampling settings and token budget (read
        only). Returns headers to propagate to a server behind the backend (a W3C `traceparent`), which
        the engine merges into `decode.trace_headers`."""
        return {}

    def upstream(self, event: UpstreamEvent) -> None:
        """Which vLLM server this attempt goes to (and, on a retry, which failed first): before its tokens."""

    def prefill(self, event: PrefillEvent) -> None:
        """The backend read the prompt; the first token follows."""

    def token(self, event: TokenEvent, channel: str, now_ns: int) -> None:
        """One generated token, the channel the parser put it in (thought, content, tool_call), and
        when it arrived (time.time_ns(), read once by the engine for every observer). The per-token
        path: keep it to a few appends, and do the work per group of tokens."""

    def tool_call(self, delta: ToolCallDelta) -> None:
        """The parser finished a tool call, with its outcome (valid, invalid_args, unknown_tool)."""

    def unparsed_call(self, delta: UnparsedCallDelta) -> None:
        """The parser gave up on markup that opened a call: it goes to the client as text."""

    def finished(self, generation: Generation) -> None:
        """The answer is complete: `generation.finish_reason`, its counts and the backend's `done` event.
        Not called when the request fails or the client leaves mid-answer."""
