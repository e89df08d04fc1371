"""A replay stored as a session of its own, in the store the recorded session came from, so the
viewer can show the two side by side (viewer/compare.py).

Each replayed step is written as a request is (proxy/observe/request_spans.py), through the store's
own writer: an OpenTelemetry TracerProvider with the store as its exporter (trace_store/provider.py).
Its request span (`replay {model}`, endpoint `replay`) carries the replay's figures
(looptrace.replay.*) and a link to the recorded step's request span ("replay_of"), as a fork links to
what it forked; its render span is the recorded one's (the same prompt), its decode span holds the
answer's tokens: in forced mode the recorded tokens with the target's logprob, rank and greedy
choice; in step mode the target's own tokens with their top five. Its tool calls are execute_tool
spans, as the server writes them.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Sequence

from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, set_span_in_context

from looptrace.common import attributes as attr
from looptrace.trace_store.provider import build_provider
from looptrace.trace_store.recorded_sessions import Recorded
from looptrace.trace_store.tokens import GROUP, columns

from ..observe.tool_spans import tool_call_span

CLIENT = "looptrace-replay"  # the client the viewer lists replayed sessions under
CARRIED = (attr.INPUT_NEW_FROM, attr.INPUT_NEW_MESSAGES, attr.GEN_AI_INPUT_MESSAGES, attr.GEN_AI_SYSTEM_INSTRUCTIONS,
           attr.GEN_AI_TOOL_DEFINITIONS)  # what a replayed step read is what the recorded one read


def session_key(original: str, mode: str) -> str:
    """Random, as every id looptrace makes: several replays of one session never share a key."""
    return f"replay-{mode}-{secrets.token_hex(4)}:{original}"


class Pieces(Sequence):
    """The vocabulary pieces a replay knows (its tokens' own and their alternatives'), indexed by id as
    tokens.columns reads a vocabulary: this process loads no tokenizer."""

    def __init__(self, *token_lists: list[dict]) -> None:
        self.known: dict[int, str] = {}
        for tokens in token_lists:
            for token in tokens:
                for i, piece in ((token["id"], token.get("piece")),
                                 *zip(token.get("top_ids") or (), token.get("top_pieces") or ())):
                    if piece:
                        self.known.setdefault(i, piece)

    def __len__(self) -> int:
        return 1 << 31

    def __getitem__(self, token_id):
        return self.known.get(token_id, "")


class Recorder:
    """Writes replayed steps; `close` waits until the store has them all, and says how many spans it lost."""

    def __init__(self, store, key: str, *, original: str, mode: str, target: str, model: str, backend: str,
                 version: str) -> None:
        self.key, self.original, self.mode, self.target = key, original, mode, target
        self.model, self.backend = model, backend
        self.lost = 0
        self.provider, self.processors = build_provider(store=store, otlp_endpoint=None, on_dropped=self._dropped,
                                                        service_name=CLIENT)
        self.tracer = self.provider.get_tracer(CLIENT)
        self.version = version

    def _dropped(self, _sink: str, count: int) -> None:
        self.lost += count

    def step(self, recorded: Recorded, result: dict, tokens: list[dict], calls: list[dict], finish_reason: str | None,
             output_messages: str | None, started_ns: int) -> str:
        """One replayed step: `tokens` as token events with their channel, `calls` as the parser
        ended them, `output_messages` the answer as gen_ai.output.messages holds it. Returns its trace id."""
        link = Link(SpanContext(int(recorded.trace_id, 16), int(recorded.span_id, 16), is_remote=True,
                                trace_flags=TraceFlags(TraceFlags.SAMPLED)), {attr.LINK: "replay_of"})
        root = self.tracer.start_span(f"{attr.ENDPOINT_REPLAY} {self.model}", kind=SpanKind.SERVER, links=[link],
                                      start_time=started_ns, attributes=self._request(recorded, result, len(tokens), finish_reason,
                                                               output_messages))
        context = set_span_in_context(root)
        render = self.tracer.start_span(attr.SPAN_RENDER, context=context, start_time=started_ns,
                                        attributes=recorded.render)
        render.end(end_time=started_ns)
        decode = self.tracer.start_span(attr.SPAN_DECODE, context=context, start_time=started_ns, attributes={
            attr.BACKEND: self.backend, attr.DECODE_TOKENS: len(tokens),
            attr.GEN_AI_RESPONSE_FINISH_REASONS: [finish_reason] if finish_reason else []})
        pieces, now = Pieces(tokens, recorded.tokens), time.time_ns()
        for start in range(0, len(tokens), GROUP):
            group = tokens[start:start + GROUP]
            decode.add_event(attr.EVENT_TOKENS, columns(group, [t.get("channel") or "" for t in group],
                                                        [now] * len(group), pieces), timestamp=now)
        decode.end(end_time=now)
        for call in calls:
            self._call(context, call)
        root.end(end_time=time.time_ns())
        return format(root.get_span_context().trace_id, "032x")

    def _request(self, recorded: Recorded, result: dict, count: int, finish_reason: str | None,
                 output_messages: str | None) -> dict:
        attributes = {
            attr.ENDPOINT: attr.ENDPOINT_REPLAY, attr.GEN_AI_OPERATION_NAME: "chat",
            attr.GEN_AI_PROVIDER_NAME: "looptrace", attr.GEN_AI_CONVERSATION_ID: self.key,
            attr.GEN_AI_REQUEST_MODEL: self.model, attr.GEN_AI_RESPONSE_MODEL: self.model,
            attr.CLIENT_NAME: CLIENT, attr.CLIENT_VERSION: self.version,
            attr.GEN_AI_USAGE_INPUT_TOKENS: len(recorded.prompt_ids), attr.GEN_AI_USAGE_OUTPUT_TOKENS: count,
            attr.GEN_AI_RESPONSE_FINISH_REASONS: [finish_reason] if finish_reason else [],
            attr.REPLAY_TRACE_ID: recorded.trace_id, attr.REPLAY_SESSION: self.original,
            attr.REPLAY_STEP: recorded.step, attr.REPLAY_MODE: self.mode, attr.REPLAY_TARGET: self.target,
            attr.REPLAY_TOKENS: result["tokens"], attr.REPLAY_AGREEING: result["agreeing"],
            attr.HTTP_RESPONSE_STATUS_CODE: 200,
        }
        if output_messages is not None:
            attributes[attr.GEN_AI_OUTPUT_MESSAGES] = output_messages
        for name in CARRIED:
            if name in recorded.request:
                attributes[name] = recorded.request[name]
        optional = {attr.REPLAY_FIRST_DIVERGENCE: result.get("first_divergence"),
                    attr.REPLAY_MEAN_LOGPROB_RECORDED: result.get("mean_logprob_recorded"),
                    attr.REPLAY_MEAN_LOGPROB_TARGET: result.get("mean_logprob_target"),
                    attr.REPLAY_TOOL_CALLS_EQUAL: result.get("tool_calls_equal")}
        attributes.update({k: v for k, v in optional.items() if v is not None})
        return attributes

    def _call(self, context, call: dict) -> None:
        outcome = call.get("outcome", "unparsed")
        if outcome == "unparsed":
            tool_call_span(self.tracer, context, outcome, call.get("raw"))
            return
        # A replay's calls are never run: a call id of its own, so no tool result joins them.
        tool_call_span(self.tracer, context, outcome, call.get("raw"), call["name"], f"replay_{secrets.token_hex(12)}",
                       call.get("index", 0), call["arguments"])

    def close(self) -> int:
        """Flushes every span to the store; the number of spans it could not store."""
        self.provider.force_flush(60_000)
        self.provider.shutdown()
        return self.lost


def forced_tokens(recorded: Recorded, scores: list[dict]) -> list[dict]:
    """The recorded tokens as the target read them: its logprob, rank and greedy choice on each."""
    out = []
    for token, s in zip(recorded.tokens, scores):
        out.append({"index": token["index"], "id": token["id"], "piece": token.get("piece", ""),
                    "text": token.get("text", ""), "special": token.get("special", False),
                    "channel": token.get("channel"), "logprob": s["logprob"], "p": math.exp(s["logprob"]),
                    "rank": s["rank"], "top_ids": [s["greedy_id"]], "top_logprobs": [s["greedy_logprob"]],
                    "top_pieces": [s.get("greedy_piece") or ""]})
    return out
